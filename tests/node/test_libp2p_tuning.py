"""The node's yamux receive-window policy (node/libp2p_tuning.py), over a
real libp2p connection: a small request costs the node no WINDOW_UPDATE
frame, and a request larger than the window still arrives whole."""

from __future__ import annotations

import struct

import pytest
import trio
import trio.testing
from libp2p.stream_muxer.yamux import yamux

from wakustore.clients.store import StoreClient
from wakustore.node.config import NodeConfig
from wakustore.node.host import running_host
from wakustore.node.store_protocols import read_frame
from wakustore.node.streams import close_stream
from wakustore.protocols.framing import encode_frame

PROTOCOL = "/wakustore-test/window/1"
# Four times yamux's initial receive window (256 KiB).
LARGE_REQUEST = 1024 * 1024


@pytest.fixture
def window_updates(monkeypatch):
    """WINDOW_UPDATE frames that only give credit (no SYN, ACK, FIN or RST),
    counted by the side that wrote them: "listener" or "dialer"."""
    counts = {"listener": 0, "dialer": 0}
    real = yamux.Yamux._write_frame

    async def counting(self, data: bytes) -> None:
        _, kind, flags, _, _ = struct.unpack(yamux.YAMUX_HEADER_FORMAT, data[:yamux.HEADER_SIZE])
        if kind == yamux.TYPE_WINDOW_UPDATE and flags == 0:
            counts["dialer" if self.is_initiator_value else "listener"] += 1
        await real(self, data)

    monkeypatch.setattr(yamux.Yamux, "_write_frame", counting)
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


def test_tcp_reads_are_served_from_one_receive_when_the_bytes_arrived_together():
    from libp2p.io.trio import TrioTCPStream

    from wakustore.node.libp2p_tuning import tune_libp2p

    tune_libp2p()
    receives = []

    async def main():
        a, b = trio.socket.socketpair()
        ours = TrioTCPStream(trio.SocketStream(a))
        theirs = trio.SocketStream(b)
        real = ours.stream.receive_some

        async def counted(n=None):
            data = await real(n)
            receives.append(len(data))
            return data

        ours.stream.receive_some = counted
        await theirs.send_all(b"\x00\x03abc\x00\x02de")
        await trio.testing.wait_all_tasks_blocked()
        got = [await ours.read(2), await ours.read(3), await ours.read(2), await ours.read(2)]
        await theirs.send_all(b"tail")
        await theirs.aclose()
        got += [await ours.read(100), await ours.read(100)]
        return got

    assert trio.run(main) == [b"\x00\x03", b"abc", b"\x00\x02", b"de", b"tail", b""]
    # The first four reads came from one receive; then the tail, then the end.
    assert receives == [9, 4, 0]
