"""The node's own Ethereum Node Record (31/WAKU2-ENR), as nwaku makes its.

Signed with the libp2p key (``node.key``), so the record names the node's
peer id. It says:

- ``ip``/``tcp`` (and ``ip6``/``tcp6``): the first TCP address peers can
  dial, preferring an announced one (``--ext-multiaddr``), then one that is
  not loopback;
- ``multiaddrs``: the other dialable addresses ``ip``/``tcp`` cannot say
  (websockets, DNS names of ``--ext-multiaddr``), as many as fit the
  record's 300 bytes;
- ``waku2``: store, lightpush and sync, and relay when it runs;
- ``rs`` (``rsv`` from 64 shards): the cluster and the shards served;
- ``udp``: the discv5 port, when discv5 runs.

The sequence number lives in ``<data_dir>/enr.json`` with a digest of the
fields: it goes up by one whenever the fields change between starts (a
new port, shard or address), so peers replace what they hold.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
from pathlib import Path
from typing import Any

import multiaddr

from wakustore.durable import replace_durably
from wakustore.node.config import NodeConfig
from wakustore.protocols import enr
from wakustore.protocols.enr import Capability, Enr

log = logging.getLogger(__name__)

ENR_STATE_FILE = "enr.json"


def node_capabilities(relay: bool) -> Capability:
    """What the node serves, as ``waku2`` flags (no filter)."""
    served = Capability.STORE | Capability.LIGHTPUSH | Capability.SYNC
    return served | Capability.RELAY if relay else served


def node_record(
    config: NodeConfig,
    private_key: bytes,
    multiaddrs: list[str],
    *,
    relay: bool,
    udp: int | None = None,
    external_ip: str | None = None,
) -> Enr:
    """The node's record for its dialable ``multiaddrs`` (each ending in
    ``/p2p/<peer id>``, announced ones last as :func:`~wakustore.node.host.dialable_addrs`
    lists them), with the next sequence number when its fields changed.
    ``udp``: the discv5 port; ``external_ip``: the IPv4 address discv5
    peers see the node at (``--discv5-enr-auto-update``), which replaces
    ``ip``."""
    fields = _fields(config, multiaddrs, relay)
    if udp is not None:
        fields["udp"] = udp
    if external_ip is not None:
        fields["ip"] = external_ip
        fields.setdefault("tcp", config.tcp_port)
    seq = _sequence(config.data_dir, fields)
    record, left_out = _fitting(private_key, seq, fields)
    if left_out:
        log.warning(
            "ENR: %d multiaddr(s) left out of the record (300 bytes at most): %s", len(left_out), ", ".join(left_out)
        )
    return record


def _fields(config: NodeConfig, multiaddrs: list[str], relay: bool) -> dict[str, Any]:
    plain = [addr.split("/p2p/", 1)[0] for addr in multiaddrs]
    announced = [a.split("/p2p/", 1)[0] for a in config.ext_multiaddrs]
    ip4 = _pick_tcp(plain, "ip4", announced)
    ip6 = _pick_tcp(plain, "ip6", announced)
    fields: dict[str, Any] = {
        "capabilities": int(node_capabilities(relay)),
        "cluster": config.cluster_id,
        "shards": sorted(config.shards),
    }
    said = set()
    if ip4 is not None:
        fields["ip"], fields["tcp"] = ip4
        said.add(f"/ip4/{ip4[0]}/tcp/{ip4[1]}")
    if ip6 is not None:
        fields["ip6"], fields["tcp6"] = ip6
        said.add(f"/ip6/{ip6[0]}/tcp/{ip6[1]}")
    # Websockets and DNS names first (what ip/tcp cannot say), announced first.
    others = [a for a in dict.fromkeys(announced + plain) if a not in said and not _loopback(a)]
    fields["multiaddrs"] = others
    return fields


def _pick_tcp(addrs: list[str], family: str, announced: list[str]) -> tuple[str, int] | None:
    """(ip, port) of the first plain TCP address of ``family``: announced
    ones first, then any that is not loopback, then loopback."""
    candidates = []
    for addr in announced + addrs:
        parts = addr.strip("/").split("/")
        if len(parts) == 4 and parts[0] == family and parts[2] == "tcp":
            candidates.append((parts[1], int(parts[3])))
    for ip, port in candidates:
        if not ipaddress.ip_address(ip).is_loopback and not ipaddress.ip_address(ip).is_unspecified:
            return ip, port
    return next(((ip, port) for ip, port in candidates if not ipaddress.ip_address(ip).is_unspecified), None)


def _loopback(addr: str) -> bool:
    parts = addr.strip("/").split("/")
    return len(parts) > 1 and parts[0] in ("ip4", "ip6") and ipaddress.ip_address(parts[1]).is_loopback


def _fitting(private_key: bytes, seq: int, fields: dict[str, Any]) -> tuple[Enr, list[str]]:
    """The record with as many of the multiaddrs as fit, and those left out."""
    kept: list[str] = []
    left_out: list[str] = []
    for addr in fields["multiaddrs"]:
        try:
            _record(private_key, seq, fields, [*kept, addr])
        except enr.EnrError:
            left_out.append(addr)
            continue
        kept.append(addr)
    return _record(private_key, seq, fields, kept), left_out


def _record(private_key: bytes, seq: int, fields: dict[str, Any], addrs: list[str]) -> Enr:
    return enr.waku_record(
        private_key,
        seq,
        capabilities=Capability(fields["capabilities"]),
        cluster=fields["cluster"],
        shards=fields["shards"],
        ip=fields.get("ip"),
        tcp=fields.get("tcp"),
        udp=fields.get("udp"),
        ip6=fields.get("ip6"),
        tcp6=fields.get("tcp6"),
        multiaddrs=[a for a in addrs if _is_multiaddr(a)],
    )


def _is_multiaddr(text: str) -> bool:
    try:
        multiaddr.Multiaddr(text)
    except Exception:  # the library raises several kinds
        return False
    return True


def _sequence(data_dir: Path, fields: dict[str, Any]) -> int:
    """The record's sequence number: the kept one while the fields are the
    same, the next one (kept, durably) when they changed."""
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    path = data_dir / ENR_STATE_FILE
    seq = 0
    try:
        state = json.loads(path.read_text())
        seq, known = int(state["seq"]), state["fields"]
        if known == digest:
            return seq
    except (OSError, ValueError, KeyError, TypeError):
        pass
    seq += 1
    replace_durably(path, (json.dumps({"seq": seq, "fields": digest}) + "\n").encode())
    return seq
