"""Errors in what a user gave: a flag, a file, a setting.

The commands, the clients (a malformed peer address) and the node's own
checks of its data directory raise :class:`UsageError`; the ``wakustore``
command reports it on one line and exits with status 2. It lives here,
below the commands, so that nothing under ``node/`` or ``clients/`` has to
import the command line.
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad command-line input; reported on one line, exit status 2."""


def parse_hex(text: str, what: str) -> bytes:
    """Hex with or without a 0x prefix; raises UsageError on anything else."""
    digits = text[2:] if text[:2] in ("0x", "0X") else text
    if len(digits) % 2:
        raise UsageError(f"{what}: odd number of hex digits")
    try:
        return bytes.fromhex(digits)
    except ValueError:
        raise UsageError(f"{what}: not hexadecimal: {text!r}") from None
