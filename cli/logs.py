"""The node's log: one JSON object a line (python-json-logger), or plain
lines on a terminal.

Every record goes through the root logger's one handler on stderr: the
node's own, py-libp2p's, Hypercorn's and the Spark client's alike. A JSON
line has ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``, the
record's extra fields, and ``exc_info`` (the whole traceback, as one
string) when there is one. ``auto`` writes plain lines when stderr is a
terminal, JSON otherwise.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from typing import TextIO

from wakustore.usage import UsageError

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("auto", "json", "text")
_ALIASES = {"warn": "warning", "fatal": "critical", "trace": "debug"}


def parse_level(text: str) -> int:
    """A level name, any case (``warn``, ``fatal`` and ``trace`` as nwaku's)."""
    name = _ALIASES.get(text.strip().lower(), text.strip().lower())
    if name not in LEVELS:
        raise UsageError(f"log level {text!r}: one of {', '.join(LEVELS)}")
    return int(getattr(logging, name.upper()))


def configure(level: str, log_format: str = "auto", stream: TextIO | None = None) -> None:
    """Send every record at ``level`` and above to ``stream`` (stderr)."""
    from pythonjsonlogger.json import JsonFormatter

    stream = sys.stderr if stream is None else stream
    numeric = parse_level(level)
    if log_format not in FORMATS:
        raise UsageError(f"log format {log_format!r}: one of {', '.join(FORMATS)}")
    if log_format == "auto":
        log_format = "text" if stream.isatty() else "json"
    handler = logging.StreamHandler(stream)
    formatter: logging.Formatter
    if log_format == "json":
        formatter = JsonFormatter(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger", "message": "msg"},
            timestamp="time",
            json_serializer=functools.partial(json.dumps, separators=(",", ":")),
        )
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%SZ")
        formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    logging.captureWarnings(True)
