"""The node's libp2p host: identity, listeners and the node-info file.

:func:`running_host` builds a host (:func:`wakustore.transport.host.new_host`:
Noise; yamux preferred, mplex offered; identify and ping) from
:class:`NodeConfig` (TCP on ``tcp_port``, websockets on ``ws_port``, both
on ``listen_host``), installs the given
stream handlers and runs it until the block exits. Identify lists every
installed protocol, which is how js-waku decides what the node serves.
Inbound connections and streams go through a
:class:`~wakustore.node.limits.Gatekeeper` (connection, per-address,
handshake and stream caps; see :mod:`wakustore.node.limits`).

The node key is a secp256k1 secret stored once at ``<data_dir>/node.key``
as 64 hex digits (mode 0600) and reused, so the peer id survives restarts.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig

from wakustore.durable import make_dirs, replace_durably
from wakustore.node.config import NodeConfig
from wakustore.node.limits import ConnectionLimits, Gatekeeper
from wakustore.transport.host import answer_with_first_write, new_host, stop_auto_dialing

log = logging.getLogger(__name__)

NODE_KEY_FILE = "node.key"
NODE_INFO_FILE = "node-info.json"

# A secp256k1 secret: 32 bytes (SEC 1), written as 64 hex digits.
NODE_KEY_SIZE = 32
NODE_KEY_MODE = 0o600

StreamHandler = Callable[[Any], Awaitable[None]]


class HostError(RuntimeError):
    """The host cannot start (port in use, unreadable key); one line for the operator."""


class ListenError(OSError):
    """A listener cannot bind its address (not on this machine, a name
    that does not resolve, a port taken or not allowed): the only failure
    ``serve`` reports as "cannot listen"."""


@contextmanager
def binding(what: str, host: str, port: int) -> Iterator[None]:
    """Around the bind of one listener (``what``, e.g. "metrics"): an
    OSError raised there is a :class:`ListenError` naming it and its address."""
    try:
        yield
    except ListenError:
        raise
    except OSError as exc:
        raise _listen_error(exc, what, host, port) from exc
    except BaseExceptionGroup as group:  # a server that binds in a nursery of its own
        failure = _os_error_of(group)
        if failure is None:
            raise
        raise _listen_error(failure, what, host, port) from group


def _listen_error(exc: OSError, what: str, host: str, port: int) -> ListenError:
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return ListenError(exc.errno, f"{exc.strerror or exc} ({what} on {where})")


def _os_error_of(group: BaseExceptionGroup) -> OSError | None:
    """The first OSError in ``group`` when every failure in it is one (or a cancellation)."""
    errors: list[OSError] = []
    for leaf in _leaves(group):
        if isinstance(leaf, OSError):
            errors.append(leaf)
        elif not isinstance(leaf, trio.Cancelled):
            return None
    return errors[0] if errors else None


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


@dataclass(frozen=True, slots=True)
class HostInfo:
    """What a running host listens on. ``multiaddrs`` end in ``/p2p/<peer id>``."""

    peer_id: str
    multiaddrs: list[str]


def load_or_create_key(data_dir: Path) -> KeyPair:
    """The node's key pair from ``<data_dir>/node.key``, created on first use.

    Creation is atomic (O_EXCL, mode 0600), so two starts racing on a fresh
    directory end up with the same key. Raises :class:`HostError` for a key
    file that is not 64 hex digits of a valid secp256k1 secret.
    """
    make_dirs(data_dir)
    path = data_dir / NODE_KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, NODE_KEY_MODE)
    except FileExistsError:
        return _read_key(path)
    secret = create_new_key_pair().private_key.to_bytes()
    with os.fdopen(fd, "w") as handle:
        handle.write(secret.hex() + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    log.info("created node key %s", path)
    return create_new_key_pair(secret)


def listen_addrs(config: NodeConfig) -> list[multiaddr.Multiaddr]:
    """The TCP and websocket listen multiaddrs of ``config``.

    With both ports 0 py-libp2p serves TCP and websockets on one
    system-chosen port (it tells them apart per connection).
    """
    if config.tcp_port and config.tcp_port == config.ws_port:
        raise HostError(f"tcp_port and ws_port are both {config.tcp_port}")
    family = "ip6" if ":" in config.listen_host else "ip4"
    base = f"/{family}/{config.listen_host}/tcp"
    return [
        multiaddr.Multiaddr(f"{base}/{config.tcp_port}"),
        multiaddr.Multiaddr(f"{base}/{config.ws_port}/ws"),
    ]


ALL_PORTS = ("tcp_port", "ws_port", "metrics_port", "mailserver_port")
LIBP2P_PORTS = ("tcp_port", "ws_port")


def check_ports_free(config: NodeConfig, names: tuple[str, ...] = ALL_PORTS) -> None:
    """Raise :class:`HostError` when a listen port is already taken.

    py-libp2p's TCP listener sets SO_REUSEPORT, so a second process on the
    same port would start without error and the kernel would share the
    incoming connections between the two. A plain bind (SO_REUSEADDR only,
    which still fails next to a listening socket) finds the stale owner.
    Port 0 is always free.
    """
    family = socket.AF_INET6 if ":" in config.listen_host else socket.AF_INET
    for name in names:
        port = getattr(config, name)
        if port == 0:
            continue
        probe = socket.socket(family, socket.SOCK_STREAM)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((config.listen_host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise HostError(f"{name} {port} on {config.listen_host} is already in use") from None
            raise HostError(f"cannot bind {name} {port} on {config.listen_host}: {exc}") from None
        finally:
            probe.close()


@asynccontextmanager
async def running_host(
    config: NodeConfig,
    handlers: Mapping[str, StreamHandler],
    key_pair: KeyPair | None = None,
    gatekeeper: Gatekeeper | None = None,
    answer_first: Iterable[str] = (),
):
    """Run a host serving ``handlers`` (protocol id -> handler); yield
    ``(host, HostInfo)``. Listeners close when the block exits.
    ``gatekeeper`` enforces the connection and stream caps (default: the
    ones ``config`` sets); each handler runs under its request limits.
    ``answer_first`` names the request/response protocols whose handler
    reads one request and always writes: see
    :func:`~wakustore.transport.host.answer_with_first_write`."""
    check_ports_free(config, LIBP2P_PORTS)
    if key_pair is None:
        key_pair = load_or_create_key(config.data_dir)
    if gatekeeper is None:
        gatekeeper = Gatekeeper(ConnectionLimits.from_config(config))
    addrs = listen_addrs(config)
    host = new_host(key_pair, addrs, service_connection_config(gatekeeper.limits))
    answer_with_first_write(host, answer_first)
    gatekeeper.install(host)
    for protocol, handler in handlers.items():
        host.set_stream_handler(TProtocol(protocol), gatekeeper.guard(protocol, handler))
    async with AsyncExitStack() as running:
        with binding("libp2p", config.listen_host, config.tcp_port):
            await running.enter_async_context(host.run(listen_addrs=addrs))
        await stop_auto_dialing(host)
        try:
            yield host, host_info(host, config.ext_multiaddrs)
        finally:
            # Close every connection on the way out: peers see the node go
            # at once (a FIN), not when a keepalive or a write fails.
            with trio.move_on_after(CLOSE_CONNECTIONS_S) as closing:
                closing.shield = True
                await host.get_network().close()


# How long a stopping node waits for its connections to close.
CLOSE_CONNECTIONS_S = 2.0


def service_connection_config(limits: ConnectionLimits = ConnectionLimits()) -> ConnectionConfig:
    """py-libp2p's connection manager set up for a node that serves.

    Its defaults keep 50 of the 300 connection slots for outbound dials
    (min_connections); a store node dials nobody, so every slot may be
    inbound. Its cap sits above the gatekeeper's, which is the one that
    decides (and decides before the handshake).
    """
    cap = limits.libp2p_max_connections
    return ConnectionConfig(min_connections=0, low_watermark=0, max_connections=cap, high_watermark=cap)


def host_info(host: IHost, ext_multiaddrs: list[str] | tuple[str, ...] = ()) -> HostInfo:
    """The peer id and the addresses to dial it on (with ``/p2p/<peer id>``),
    TCP first: see :func:`dialable_addrs`."""
    peer_id = host.get_id().to_base58()
    listening = sorted((str(a) for a in host.get_transport_addrs()), key=lambda text: text.endswith("/ws"))
    return HostInfo(peer_id=peer_id, multiaddrs=dialable_addrs(listening, peer_id, ext_multiaddrs))


def interface_addresses(family: str) -> list[str]:
    """This machine's addresses of ``family`` (``ip4`` or ``ip6``),
    loopback first; IPv6 link-local ones are left out (they need a zone
    to be dialed)."""
    import psutil

    kind = socket.AF_INET if family == "ip4" else socket.AF_INET6
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            if addr.family != kind:
                continue
            ip = ipaddress.ip_address(addr.address.split("%", 1)[0])
            if not ip.is_link_local:
                found.add(ip)
    return [str(ip) for ip in sorted(found, key=lambda ip: (not ip.is_loopback, ip))]


def dialable_addrs(
    listening: list[str],
    peer_id: str,
    ext_multiaddrs: list[str] | tuple[str, ...] = (),
    interfaces: Callable[[str], list[str]] = interface_addresses,
) -> list[str]:
    """What a peer can dial: each listen multiaddr, one per interface
    address when it is bound to the unspecified address (0.0.0.0 or ::,
    which nobody can dial), then the announced ``ext_multiaddrs`` (nwaku's
    ``--ext-multiaddr``: an address the node is reached at from outside,
    behind NAT or a proxy). Each ends in ``/p2p/<peer id>``."""
    suffix = f"/p2p/{peer_id}"
    out: list[str] = []
    for addr in listening:
        _, family, host, *rest = addr.split("/")
        expanded = [addr]
        if family in ("ip4", "ip6") and ipaddress.ip_address(host).is_unspecified:
            expanded = ["/".join(["", family, ip, *rest]) for ip in interfaces(family)] or expanded
        out.extend(a + suffix for a in expanded if a + suffix not in out)
    for addr in ext_multiaddrs:
        full = addr if "/p2p/" in addr else addr.rstrip("/") + suffix
        if full not in out:
            out.append(full)
    return out


def write_node_info(data_dir: Path, info: HostInfo, **extra: Any) -> Path:
    """Write ``<data_dir>/node-info.json`` whole and durably: peer id,
    multiaddrs and ``extra``."""
    path = data_dir / NODE_INFO_FILE
    body = {"peer_id": info.peer_id, "multiaddrs": info.multiaddrs, **extra}
    replace_durably(path, (json.dumps(body, indent=2) + "\n").encode())
    return path


def _read_key(path: Path) -> KeyPair:
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise HostError(f"cannot read node key {path}: {exc}") from None
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) != NODE_KEY_SIZE:
        raise HostError(f"node key {path} is not {NODE_KEY_SIZE * 2} hex digits")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        log.warning("node key %s is readable by others (mode %o); expected 600", path, mode)
    try:
        return create_new_key_pair(secret)
    except Exception as exc:  # coincurve: zero or above the group order
        raise HostError(f"node key {path} is not a valid secp256k1 secret: {exc}") from None
