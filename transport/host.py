"""The libp2p host this project runs, for the node and for the clients.

:func:`new_host` builds a py-libp2p host through its own options: Noise
(:class:`~wakustore.transport.libp2p.NoiseTransport`) as the only secure
channel (nwaku and js-waku speak nothing else; py-libp2p would also offer
TLS, SECIO and plaintext), yamux
(:class:`~wakustore.transport.libp2p.Yamux`) preferred and mplex offered
for older js-waku (wire-facts: its default is mplex), and the listener's
multistream-select of :class:`~wakustore.transport.libp2p.Multiselect`.
Nothing of py-libp2p's classes changes: two hosts in one process, one of
ours and one of py-libp2p's defaults, each behave as built.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import multiaddr
from libp2p import new_host as libp2p_new_host
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.stream_muxer.mplex.mplex import MPLEX_PROTOCOL_ID, Mplex
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID

from wakustore.transport.libp2p import (
    Multiselect,
    MuxerMultistream,
    NoiseTransport,
    Yamux,
    skip_idle_notifications,
)


def new_host(
    key_pair: KeyPair | None = None,
    listen_addrs: Sequence[multiaddr.Multiaddr] | None = None,
    connection_config: ConnectionConfig | None = None,
    websocket: bool = False,
) -> IHost:
    """A host with ``key_pair`` (a fresh one by default) that will listen
    on ``listen_addrs`` (TCP and ``/ws`` addresses; none for a client) and
    can dial TCP, and websockets when ``websocket``. Run it with
    ``host.run(listen_addrs=...)``."""
    key_pair = key_pair or create_new_key_pair()
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    muxers: Any = {TProtocol(YAMUX_PROTOCOL_ID): Yamux, TProtocol(MPLEX_PROTOCOL_ID): Mplex}
    host = libp2p_new_host(
        key_pair=key_pair,
        sec_opt={TProtocol(NOISE_PROTOCOL_ID): noise},
        muxer_opt=muxers,
        listen_addrs=listen_addrs,
        connection_config=connection_config,
        enable_websocket=websocket,
    )
    swarm: Any = host.get_network()
    upgrader = swarm.upgrader
    upgrader.muxer_multistream = MuxerMultistream(muxers, upgrader.muxer_multistream.negotiate_timeout)
    host.multiselect = Multiselect(dict(host.get_mux().handlers))  # type: ignore[attr-defined]
    skip_idle_notifications(swarm)
    return host


def answer_with_first_write(host: IHost, protocols: Iterable[str]) -> None:
    """Let inbound streams of ``protocols`` (request/response protocols
    whose handler reads one request, then always writes) carry their
    multistream-select answer in the handler's first write when the
    request came with the protocol id."""
    mux: Any = host.get_mux()
    if isinstance(mux, Multiselect):
        mux.answer_with_first_write.update(protocols)


async def stop_auto_dialing(host: IHost) -> None:
    """Stop py-libp2p's auto-connector, which otherwise dials peers from the
    peerstore (every client identify told us about) until 150 connections
    are open. Serving nodes wait to be dialed; relay peering picks its own
    peers; a client dials the one node it asks."""
    await host.get_network().auto_connector.stop()  # type: ignore[attr-defined]
