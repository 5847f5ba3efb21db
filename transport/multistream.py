"""multistream-select 1.0.0 as this project speaks it, bytes in and out:
the messages a dialer sends to select a protocol and the parsing of the
listener's answer. py-libp2p negotiates for the host's own listeners
(:class:`wakustore.transport.libp2p.Multiselect` answers the common case
in one write); a request/response dialer selects lazily with
:func:`select_message` and checks the echo with :func:`read_selected`.
"""

from __future__ import annotations

from typing import Any

from wakustore.protocols.framing import encode_uvarint
from wakustore.transport.streams import read_chunk, read_frame

# The header line, and the longest protocol id parsed here (go-libp2p
# refuses longer ones: its protocol-id limit is 1024).
MULTISTREAM = b"/multistream/1.0.0"
MAX_PROTOCOL_ID = 1024
# The most a listener's answer to the header and one protocol id may take
# (two protocol ids of the longest length, each with its length and newline).
MAX_SELECT_ANSWER = 2 * (MAX_PROTOCOL_ID + 3)


class NegotiationError(Exception):
    """The listener does not serve the protocol, or answered something else."""


def message(text: bytes) -> bytes:
    """One multistream-select message: varint length, text, newline."""
    return encode_uvarint(len(text) + 1) + text + b"\n"


def select_message(protocol: str) -> bytes:
    """multistream-select's header and ``protocol``, as a dialer sends them."""
    return message(MULTISTREAM) + message(protocol.encode())


def parse_lines(data: bytes | bytearray, count: int) -> tuple[list[bytes], int] | None:
    """The first ``count`` multistream-select messages of ``data`` (each a
    varint length, then text ending in a newline; returned without it) and
    the bytes they take; None when they are not all there yet or one is
    malformed or longer than a protocol id may be."""
    lines, pos = [], 0
    for _ in range(count):
        length = shift = 0
        while True:
            if pos >= len(data) or shift > 14:
                return None
            byte = data[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if length == 0 or length > MAX_PROTOCOL_ID + 1 or pos + length > len(data):
            return None
        line = data[pos : pos + length]
        if line[-1:] != b"\n":
            return None
        lines.append(bytes(line[:-1]))
        pos += length
    return lines, pos


def complete_frame(data: bytes | bytearray, start: int) -> bool:
    """True when ``data[start:]`` begins with a whole varint-length-prefixed frame."""
    length = shift = 0
    for pos in range(start, min(start + 10, len(data))):
        byte = data[pos]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return len(data) - pos - 1 >= length
    return False


async def read_selected(stream: Any, protocol: str, max_response: int) -> bytes | None:
    """The listener's multistream-select answer to :func:`select_message`,
    then one length-prefixed response frame of at most ``max_response``
    bytes (None when the stream ends before it begins). Raises
    :class:`NegotiationError` when the listener does not serve ``protocol``
    or answers something else, FramingError for a malformed frame."""
    received = b""
    while (parsed := parse_lines(received, 2)) is None:
        if len(received) > MAX_SELECT_ANSWER:
            raise NegotiationError("malformed protocol negotiation from the node")
        chunk = await read_chunk(stream)
        if not chunk:
            raise NegotiationError("the node closed the stream during protocol negotiation")
        received += chunk
    (header, answer), used = parsed
    if header != MULTISTREAM:
        raise NegotiationError(f"the node speaks {header[:60]!r}, not multistream-select 1.0.0")
    if answer != protocol.encode():
        if answer == b"na":
            raise NegotiationError("the node does not serve this protocol")
        raise NegotiationError(f"the node answered {answer[:60]!r} to the protocol id")
    stream.set_protocol(protocol)
    return await read_frame(stream, max_response, first=received[used:])
