"""The transport's replacements of py-libp2p code (transport/libp2p.py),
over real libp2p connections: a small request costs the node no
WINDOW_UPDATE frame and a request larger than the window still arrives
whole; a request/response stream costs the client one write and the node
one; multistream-select still works with dialers that wait for the node's
header or ask for a protocol it does not serve; notifees that handle
streams still hear of them; the secure session and the Noise reader hand
out the bytes of their messages exactly. And what the overrides rely on:
py-libp2p is the pinned release, the upstream methods they replace are
unchanged, and no py-libp2p class is modified by importing or using the
transport, the node's host or the client library."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing
from libp2p.stream_muxer.yamux import yamux

from wakustore.clients.store import StoreClient
from wakustore.node.config import NodeConfig
from wakustore.node.host import running_host
from wakustore.protocols import metadata
from wakustore.protocols.framing import METADATA_MAX_SIZE, encode_frame
from wakustore.transport import libp2p as ours
from wakustore.transport.streams import close_stream, read_frame

PROTOCOL = "/wakustore-test/window/1"
# Four times yamux's initial receive window (256 KiB).
LARGE_REQUEST = 1024 * 1024


@pytest.fixture
def window_updates(monkeypatch):
    """WINDOW_UPDATE frames that only give credit (no SYN, ACK, FIN or RST),
    counted by the side that wrote them: "listener" or "dialer"."""
    counts = {"listener": 0, "dialer": 0}
    real = ours.Yamux._write_frame

    async def counting(self, data: bytes) -> None:
        _, kind, flags, _, _ = struct.unpack(yamux.YAMUX_HEADER_FORMAT, data[: yamux.HEADER_SIZE])
        if kind == yamux.TYPE_WINDOW_UPDATE and flags == 0:
            counts["dialer" if self.is_initiator_value else "listener"] += 1
        await real(self, data)

    monkeypatch.setattr(ours.Yamux, "_write_frame", counting)
    return counts


async def _answer_with_size(stream) -> None:
    """Read one request frame, answer with its size."""
    request = await read_frame(stream, 2 * LARGE_REQUEST)
    await stream.write(encode_frame(str(len(request)).encode()))
    await close_stream(stream)


def _exchange(tmp_path, requests: list[bytes]) -> list[bytes]:
    config = NodeConfig(data_dir=tmp_path, tcp_port=0, ws_port=0, listen_host="127.0.0.1").validate()

    async def main():
        async with running_host(config, {PROTOCOL: _answer_with_size}) as (_, info):
            addr = next(a for a in info.multiaddrs if "/ws/" not in a)
            async with StoreClient.connect(addr) as client:
                with trio.fail_after(30):
                    return [await client.exchange(PROTOCOL, encode_frame(r), 100) for r in requests]

    return trio.run(main)


def test_small_requests_cost_no_window_update(tmp_path, window_updates):
    answers = _exchange(tmp_path, [b"q" * size for size in (10, 300, 5000)])
    assert answers == [b"10", b"300", b"5000"]
    # Before: one WINDOW_UPDATE per read (multistream-select's varint
    # bytes and lines, the request), from each side.
    assert window_updates == {"listener": 0, "dialer": 0}


def test_a_request_larger_than_the_window_arrives_whole(tmp_path, window_updates):
    assert _exchange(tmp_path, [b"x" * LARGE_REQUEST]) == [str(LARGE_REQUEST).encode()]
    # Credit went back in a few large updates (one per half window at
    # most), not one per read.
    assert 1 <= window_updates["listener"] <= 2 * LARGE_REQUEST // yamux.DEFAULT_WINDOW_SIZE


class _PlainNoise(ours.NoiseReader):
    """The Noise reader with encryption left out, over a socket pair."""

    def decrypt(self, data: bytes) -> bytes:
        return data


def test_noise_messages_that_arrived_together_are_read_with_one_receive():
    from libp2p.io.exceptions import IncompleteReadError
    from libp2p.io.trio import TrioTCPStream

    receives = []

    async def main():
        a, b = trio.socket.socketpair()
        raw = TrioTCPStream(trio.SocketStream(a))
        theirs = trio.SocketStream(b)
        real = raw.stream.receive_some

        async def counted(n=None):
            data = await real(n)
            receives.append(len(data))
            return data

        raw.stream.receive_some = counted
        reader = _PlainNoise(raw, None)
        await theirs.send_all(b"\x00\x03abc\x00\x02de\x00\x04fg")
        await trio.testing.wait_all_tasks_blocked()
        got = [await reader.read_msg(), await reader.read_msg()]
        # A message split across receives is joined.
        await theirs.send_all(b"hi")
        got.append(await reader.read_msg())
        await theirs.send_all(b"\x00\x05ab")
        await theirs.aclose()
        with pytest.raises(IncompleteReadError) as ended:
            await reader.read_msg()
        return got, ended.value.received_bytes

    got, received = trio.run(main)
    assert got == [b"abc", b"de", b"fghi"]
    assert received == 2
    # Both first messages and the start of the third came in one receive.
    assert receives[0] == 13 and len(receives) == 4


# --- writes per request ----------------------------------------------------------


def _run(main, deadline_s: float = 30.0):
    async def bounded():
        with trio.fail_after(deadline_s):
            return await main()

    return trio.run(bounded)


def _frames(data: bytes) -> list[tuple[int, int, int, int]]:
    """The yamux frames in one secure-session write: (type, flags, stream id,
    length); none for a write before yamux (the muxer's negotiation)."""
    out, pos = [], 0
    while pos < len(data):
        if len(data) - pos < yamux.HEADER_SIZE:
            return []
        _, kind, flags, sid, length = struct.unpack(yamux.YAMUX_HEADER_FORMAT, data[pos : pos + yamux.HEADER_SIZE])
        out.append((kind, flags, sid, length))
        pos += yamux.HEADER_SIZE + (length if kind == yamux.TYPE_DATA else 0)
    return out


@pytest.fixture
def session_writes(monkeypatch):
    """Every secure-session write (one Noise message), as its yamux frames,
    by the side that wrote it: "listener" or "dialer"."""
    writes = {"listener": [], "dialer": []}
    real = ours.Session.write

    async def recording(self, data: bytes) -> None:
        writes["dialer" if self.is_initiator else "listener"].append(_frames(data))
        await real(self, data)

    monkeypatch.setattr(ours.Session, "write", recording)
    return writes


def _metadata_node(tmp_path):
    from wakustore.node.store_protocols import StoreProtocols

    config = NodeConfig(
        data_dir=tmp_path, tcp_port=0, ws_port=0, listen_host="127.0.0.1", cluster_id=16, shards=[0, 1]
    ).validate()
    protocols = StoreProtocols(None, config)
    return config, {metadata.PROTOCOL_ID: protocols.handle_metadata}


def _streams_of(writes: list[list[tuple]], stream_ids: set[int]) -> list[list[tuple]]:
    return [[f for f in frames if f[2] in stream_ids] for frames in writes if any(f[2] in stream_ids for f in frames)]


def test_a_request_costs_the_dialer_one_write_and_the_node_one(tmp_path, session_writes, monkeypatch):
    config, handlers = _metadata_node(tmp_path)
    opened = []
    requester = []
    # The streams the requests open: the client's identify, which starts
    # with the connection, opens one of its own at the same time.
    open_stream = ours.Yamux.open_stream

    async def recording(self):
        stream = await open_stream(self)
        if trio.lowlevel.current_task() in requester:
            opened.append(stream.stream_id)
        return stream

    monkeypatch.setattr(ours.Yamux, "open_stream", recording)

    held = []

    async def main():
        async with running_host(config, handlers, answer_first=handlers) as (host, info):
            addr = next(a for a in info.multiaddrs if "/ws/" not in a)
            async with StoreClient.connect(addr) as client:
                requester.append(trio.lowlevel.current_task())
                answers = []
                for _ in range(3):
                    answers.append(await client.metadata(metadata.Metadata(cluster_id=16, shards=(0,))))
                # Nothing held back for streams that are done.
                for conns in host.get_network().connections.values():
                    for node_conn in conns:
                        held.append((set(node_conn.muxed_conn.acks), dict(node_conn.muxed_conn.ahead)))
                return answers

    answers = _run(main)
    assert held and all(acks == set() and ahead == {} for acks, ahead in held)
    assert [(a.cluster_id, a.shards) for a in answers] == [(16, (0, 1))] * 3
    assert len(opened) == 3
    syn, ack, fin = yamux.FLAG_SYN, yamux.FLAG_ACK, yamux.FLAG_FIN
    wu, data = yamux.TYPE_WINDOW_UPDATE, yamux.TYPE_DATA
    for sid in opened:
        dialer = _streams_of(session_writes["dialer"], {sid})
        listener = _streams_of(session_writes["listener"], {sid})
        # The dialer: SYN, multistream-select with the request, FIN, in one
        # write (before: five writes and two round trips before the request).
        assert [[(k, f) for k, f, _, _ in w] for w in dialer] == [[(wu, syn), (data, 0), (wu, fin)]]
        # The node: its ACK, the multistream-select answer, the answer and
        # its FIN, in one write: the request came with the protocol id, so
        # the node answers without waiting for the dialer (before: ACK,
        # header, protocol id, answer and FIN, five writes).
        assert [[(k, f) for k, f, _, _ in w] for w in listener] == [[(wu, ack), (data, 0), (data, 0), (wu, fin)]]


def test_a_large_answer_written_corked_still_arrives_whole(tmp_path):
    from wakustore.transport.libp2p import corked

    config = NodeConfig(data_dir=tmp_path, tcp_port=0, ws_port=0, listen_host="127.0.0.1").validate()

    async def answer_large(stream) -> None:
        size = int(await read_frame(stream, 100))
        # More than the stream's send window: the write must not wait for
        # credit with its frames held back.
        async with corked(stream):
            await stream.write(encode_frame(b"a" * size))
            await close_stream(stream)

    async def main():
        async with running_host(config, {PROTOCOL: answer_large}) as (_, info):
            addr = next(a for a in info.multiaddrs if "/ws/" not in a)
            async with StoreClient.connect(addr) as client:
                return await client.exchange(PROTOCOL, encode_frame(str(LARGE_REQUEST).encode()), 2 * LARGE_REQUEST)

    assert _run(main) == b"a" * LARGE_REQUEST


# --- multistream-select ----------------------------------------------------------


async def _read_line(stream, buffered: bytearray) -> bytes:
    """One multistream-select message (without its newline) from ``stream``."""
    from wakustore.transport.multistream import parse_lines

    while (parsed := parse_lines(bytes(buffered), 1)) is None:
        chunk = await stream.read(1024)
        assert chunk, "stream ended"
        buffered += chunk
    (line,), used = parsed
    del buffered[:used]
    return line


@pytest.mark.parametrize("dialer", ["waits-for-the-header", "waits-for-the-echo", "asks-an-unserved-protocol-first"])
def test_multistream_select_with_dialers_that_do_not_send_everything_at_once(tmp_path, dialer):
    from libp2p.utils import encode_delim

    config, handlers = _metadata_node(tmp_path)
    request = encode_frame(metadata.encode_request(metadata.Metadata(cluster_id=16, shards=(0,))))

    async def main():
        async with running_host(config, handlers) as (_, info):
            addr = next(a for a in info.multiaddrs if "/ws/" not in a)
            async with StoreClient.connect(addr) as client:
                stream = await client.host.get_network().new_stream(client.peer_id)
                got, buffered = [], bytearray()
                if dialer == "waits-for-the-header":
                    await stream.write(encode_delim(b"/multistream/1.0.0"))
                    got.append(await _read_line(stream, buffered))
                    await stream.write(encode_delim(metadata.PROTOCOL_ID.encode()))
                    got.append(await _read_line(stream, buffered))
                elif dialer == "waits-for-the-echo":
                    # Header and protocol id together, the request only once
                    # the node has echoed the protocol id.
                    await stream.write(
                        encode_delim(b"/multistream/1.0.0") + encode_delim(metadata.PROTOCOL_ID.encode())
                    )
                    got += [await _read_line(stream, buffered), await _read_line(stream, buffered)]
                else:
                    await stream.write(encode_delim(b"/multistream/1.0.0") + encode_delim(b"/not/served/1"))
                    got += [await _read_line(stream, buffered), await _read_line(stream, buffered)]
                    await stream.write(encode_delim(metadata.PROTOCOL_ID.encode()))
                    got.append(await _read_line(stream, buffered))
                await stream.write(request)
                await stream.close_write()
                rest = bytes(buffered)
                while chunk := await _read_or_end(stream):
                    rest += chunk
                await stream.close()
                return got, rest

    got, rest = _run(main)
    served = metadata.PROTOCOL_ID.encode()
    if dialer != "asks-an-unserved-protocol-first":
        assert got == [b"/multistream/1.0.0", served]
    else:
        assert got == [b"/multistream/1.0.0", b"na", served]
    from wakustore.protocols.framing import FrameReader

    (answer,) = FrameReader(METADATA_MAX_SIZE).feed(rest)
    assert metadata.decode_response(answer).shards == (0, 1)


async def _read_or_end(stream) -> bytes:
    from libp2p.network.stream.exceptions import StreamEOF

    try:
        return await stream.read(4096)
    except StreamEOF:
        return b""


def test_the_client_is_told_when_the_node_does_not_serve_a_protocol(tmp_path):
    from wakustore.clients.store import ClientError

    config, handlers = _metadata_node(tmp_path)

    async def main():
        async with running_host(config, handlers) as (_, info):
            addr = next(a for a in info.multiaddrs if "/ws/" not in a)
            async with StoreClient.connect(addr) as client:
                with pytest.raises(ClientError, match="does not serve"):
                    await client.exchange("/not/served/1", encode_frame(b"x"), 100)
                # The connection still serves what the node does serve.
                return await client.metadata(metadata.Metadata(cluster_id=16, shards=(0,)))

    assert _run(main).shards == (0, 1)


# --- notifications -----------------------------------------------------------------


def test_notifees_that_handle_streams_still_hear_of_them(tmp_path):
    from wakustore.transport.libp2p import does_nothing

    class Counting:
        def __init__(self):
            self.opened = self.closed = 0

        async def opened_stream(self, network, stream):
            self.opened += 1

        async def closed_stream(self, network, stream):
            self.closed += 1

        async def connected(self, network, conn):
            """Nothing to do."""

        async def disconnected(self, network, conn):
            return None

        async def listen(self, network, addr):
            pass

        async def listen_close(self, network, addr):
            pass

    counting = Counting()
    assert not does_nothing(Counting.opened_stream)
    assert does_nothing(Counting.connected) and does_nothing(Counting.disconnected) and does_nothing(Counting.listen)
    config, handlers = _metadata_node(tmp_path)

    async def main():
        async with running_host(config, handlers) as (host, info):
            host.get_network().register_notifee(counting)
            addr = next(a for a in info.multiaddrs if "/ws/" not in a)
            async with StoreClient.connect(addr) as client:
                for _ in range(2):
                    await client.metadata(metadata.Metadata(cluster_id=16, shards=(0,)))
            with trio.fail_after(10):
                while counting.closed < 2:
                    await trio.sleep(0.01)

    _run(main)
    assert counting.opened >= 2 and counting.closed >= 2


# --- secure-session reads ------------------------------------------------------------


class _Messages:
    """A secure session's message source: hands out queued messages, then b""."""

    def __init__(self, messages):
        self.messages = list(messages)
        self.reads = 0

    async def read_msg(self):
        self.reads += 1
        return self.messages.pop(0) if self.messages else b""


def _session(messages):
    session = ours.Session.__new__(ours.Session)
    session.conn = _Messages(messages)
    session.msg, session.pos = b"", 0
    return session


def test_secure_session_reads_split_and_join_messages_exactly():
    from libp2p.io.exceptions import ConnectionClosedError

    session = _session([b"abcdef", b"gh", b"ijk"])

    async def main():
        got = [
            await session.read(2),
            await session.read(3),
            await session.read(None),
            await session.read(4),
            await session.read(5),
        ]
        with pytest.raises(ConnectionClosedError):
            await session.read(1)
        return got

    # Within one message, what is left of it, across the end of one message
    # into the next, a short read at the end of the connection, then the end.
    assert trio.run(main) == [b"ab", b"cde", b"f", b"ghij", b"k"]
    assert session.conn.reads == 5


def test_secure_session_read_of_a_whole_message_returns_it():
    session = _session([b"0123456789", b"xy"])

    async def main():
        return [await session.read(10), await session.read(None), await session.read(None)]

    from libp2p.io.exceptions import ConnectionClosedError

    with pytest.raises(ConnectionClosedError):
        trio.run(main)
    session = _session([b"0123456789", b"xy"])

    async def two():
        return [await session.read(10), await session.read(None)]

    assert trio.run(two) == [b"0123456789", b"xy"]


# --- what the overrides rely on --------------------------------------------------------


def test_py_libp2p_is_the_release_the_overrides_were_written_for():
    from importlib.metadata import version

    assert version("libp2p") == ours.PINNED_VERSION


@pytest.mark.parametrize("name", sorted(ours.REPLACED))
def test_the_upstream_code_an_override_replaces_is_unchanged(name):
    """A py-libp2p upgrade that changes a method overridden in
    transport/libp2p.py fails here until the override is reviewed against
    the new code and its fingerprint updated."""
    assert ours.source_fingerprint(name) == ours.REPLACED[name], (
        f"{name} changed upstream: review its override in transport/libp2p.py"
    )


# Run in a fresh interpreter: py-libp2p's classes are recorded before any
# of the project is imported, then a node host serves a client's request
# (both through the project's own code), then they are compared.
_NO_CLASS_CHANGES = r"""
import sys, importlib, inspect
import libp2p, libp2p.stream_muxer.yamux.yamux, libp2p.security.secure_session
import libp2p.security.noise.io, libp2p.security.noise.transport, libp2p.network.swarm
import libp2p.protocol_muxer.multiselect, libp2p.io.trio, libp2p.host.basic_host
import libp2p.transport.tcp.tcp

def classes():
    out = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("libp2p"):
            continue
        for cls_name, cls in list(vars(module).items()):
            if inspect.isclass(cls) and cls.__module__ == name:
                out[f"{name}.{cls_name}"] = {k: id(v) for k, v in vars(cls).items()}
    return out

before = classes()
import trio
from wakustore.transport.host import new_host, answer_with_first_write
from wakustore.transport.streams import read_frame, close_stream
from wakustore.protocols.framing import encode_frame
from wakustore.clients.store import StoreClient
import multiaddr

async def echo(stream):
    request = await read_frame(stream, 100)
    await stream.write(encode_frame(request[::-1]))
    await close_stream(stream)

async def main():
    addr = multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")
    host = new_host(listen_addrs=[addr])
    host.set_stream_handler("/test/echo/1", echo)
    answer_with_first_write(host, ["/test/echo/1"])
    async with host.run(listen_addrs=[addr]):
        target = f"{host.get_addrs()[0]}"
        if "/p2p/" not in target:
            target += f"/p2p/{host.get_id()}"
        async with StoreClient.connect(target) as client:
            with trio.fail_after(20):
                return await client.exchange("/test/echo/1", encode_frame(b"olleh"), 100)

assert trio.run(main) == b"hello"
after = classes()
changed = sorted(name for name in before if name in after and before[name] != after[name])
print("CHANGED", changed)
"""


def test_no_py_libp2p_class_is_changed_by_the_transport_or_the_client():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _NO_CLASS_CHANGES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CHANGED []" in done.stdout, done.stdout[-3000:]
