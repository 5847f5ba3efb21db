"""Discovery of relay peers: EIP-1459 DNS trees (nwaku's
``--dns-discovery-url``), peer exchange with other nodes (nwaku's
``--peer-exchange-node``; :func:`run_peer_exchange_client`) and discv5
(node/discv5.py; :func:`discv5_finder`).

Every :data:`DNS_DISCOVERY_INTERVAL_S` each tree is walked
(:func:`wakustore.transport.dns.walk_tree`: every entry's hash and the
root's signature checked); of the records found, those of relay nodes of
our cluster sharing one of our shards, other than ourselves, are given to
the relay, which dials them and keeps them connected. A tree that cannot
be read is logged and tried again at the next round.
"""

from __future__ import annotations

import logging

import trio

from wakustore.node.config import NodeConfig
from wakustore.node.peer_exchange import PeerRecords
from wakustore.node.relay import Relay
from wakustore.protocols import enr
from wakustore.transport.dns import DnsLookupError, walk_tree
from wakustore.transport.peers import PeerAddressError, connect, parse_peer

log = logging.getLogger(__name__)

# nwaku re-reads its DNS trees every 30 minutes (discovery loop).
DNS_DISCOVERY_INTERVAL_S = 30 * 60.0


def relay_records(records: list[str], config: NodeConfig, own_peer_id: str) -> list[enr.Enr]:
    """Of ``records`` (``enr:`` texts), those of relay nodes of our cluster
    that share one of our shards and say where to dial them; malformed
    records, others and ourselves are left out."""
    wanted: list[enr.Enr] = []
    for text in records:
        try:
            record = enr.decode(text)
            capabilities = record.capabilities
            shards = record.relay_shards
            dialable = record.dialable()
        except enr.EnrError as exc:
            log.debug("discovered record skipped: %s", exc)
            continue
        if capabilities is None or enr.Capability.RELAY not in capabilities or shards is None:
            continue
        if shards.cluster != config.cluster_id or not set(shards.shards) & set(config.shards):
            continue
        if record.peer_id == own_peer_id or not dialable:
            continue
        wanted.append(record)
    return wanted


async def run_dns_discovery(
    config: NodeConfig,
    relay: Relay | None,
    own_peer_id: str,
    records: PeerRecords | None = None,
    metrics=None,
    discv5_node=None,
) -> None:
    """Walk the configured trees now and every interval; hand the relay
    nodes found to ``relay`` (when it runs) and their records to
    ``records`` (what peer exchange hands out); every record of the tree
    with a UDP port goes to ``discv5_node``'s table too, as nwaku
    bootstraps discv5 from its DNS trees."""
    while True:
        for url in config.dns_discovery_urls:
            found = await _discover(url, config, relay, own_peer_id, records, metrics)
            if discv5_node is not None:
                for text in found:
                    try:
                        discv5_node.learn(enr.decode(text))
                    except enr.EnrError:
                        continue
        await trio.sleep(DNS_DISCOVERY_INTERVAL_S)


async def _discover(
    url: str, config: NodeConfig, relay: Relay | None, own_peer_id: str, records: PeerRecords | None, metrics
) -> list[str]:
    """The records of the tree at ``url`` (texts); its relay nodes handed over."""
    try:
        walk = await walk_tree(url, config.dns_discovery_name_servers)
    except DnsLookupError as exc:
        log.warning("DNS discovery %s: %s", url, exc)
        _count_round(metrics, "dns", "lookup_failed")
        return []
    if walk.error is not None:
        log.warning("DNS discovery %s: stopped: %s", url, walk.error)
    _count_round(metrics, "dns", "ok" if walk.error is None else walk.error.reason.value)
    added = _hand_over(relay_records(walk.enrs, config, own_peer_id), relay, records, metrics, "dns")
    log.info("DNS discovery %s: %d records, %d new relay peers", url, len(walk.enrs), added)
    return list(walk.enrs)


# Relay peers below which the peer-exchange nodes are asked for more, and
# how often that is looked at (nwaku asks when it lacks relay peers, every
# minute at most).
PEER_EXCHANGE_WANTED = 6
PEER_EXCHANGE_INTERVAL_S = 60.0
PEER_EXCHANGE_TIMEOUT_S = 20.0


async def run_peer_exchange_client(
    config: NodeConfig, relay: Relay, host, own_peer_id: str, records: PeerRecords | None = None, metrics=None
) -> None:
    """Ask each ``--peer-exchange-node`` for records while the relay has
    fewer than :data:`PEER_EXCHANGE_WANTED` peers; hand the relay nodes of
    our cluster and shards to ``relay``."""
    while True:
        if relay.peer_count() < PEER_EXCHANGE_WANTED:
            for addr in config.peer_exchange_nodes:
                await _exchange(addr, config, relay, host, own_peer_id, records, metrics)
        await trio.sleep(PEER_EXCHANGE_INTERVAL_S)


async def _exchange(addr: str, config: NodeConfig, relay: Relay, host, own_peer_id: str, records, metrics) -> None:
    from wakustore.clients.store import ClientError, StoreClient
    from wakustore.protocols import peer_exchange
    from wakustore.protocols.framing import PEER_EXCHANGE_MAX_RESPONSE_SIZE

    try:
        info = parse_peer(addr)
        with trio.fail_after(PEER_EXCHANGE_TIMEOUT_S):
            await connect(host, info)
        client = StoreClient(host, info.peer_id, PEER_EXCHANGE_TIMEOUT_S)
        raw = await client.request(
            peer_exchange.PROTOCOL_ID,
            peer_exchange.encode_request(peer_exchange.MAX_PEERS),
            PEER_EXCHANGE_MAX_RESPONSE_SIZE,
        )
        answer = peer_exchange.decode_response(raw)
    except (ClientError, enr.EnrError, PeerAddressError, trio.TooSlowError, OSError) as exc:
        log.warning("peer exchange with %s: %s", addr, exc)
        _count_round(metrics, "peer_exchange", "failed")
        return
    except Exception as exc:  # a libp2p dial failure, a malformed answer
        log.warning("peer exchange with %s: %r", addr, exc)
        _count_round(metrics, "peer_exchange", "failed")
        return
    if answer.status_code != 200:
        log.info("peer exchange with %s: %d %s", addr, answer.status_code, answer.status_desc or "")
        _count_round(metrics, "peer_exchange", str(answer.status_code))
        return
    texts = []
    for raw_record in answer.enrs:
        try:
            texts.append(enr.decode(raw_record).text)
        except enr.EnrError as exc:
            log.debug("peer exchange with %s: a record skipped: %s", addr, exc)
    _count_round(metrics, "peer_exchange", "ok")
    added = _hand_over(relay_records(texts, config, own_peer_id), relay, records, metrics, "peer_exchange")
    log.info("peer exchange with %s: %d records, %d new relay peers", addr, len(answer.enrs), added)


def discv5_finder(config: NodeConfig, relay: Relay | None, own_peer_id: str, records: PeerRecords | None, metrics):
    """What discv5 calls with each record it learns: a relay node of our
    cluster sharing a shard goes to the relay and to peer exchange."""

    def found(record: enr.Enr) -> None:
        _hand_over(relay_records([record.text], config, own_peer_id), relay, records, metrics, "discv5")

    return found


# The origin names of nwaku's peer store (the REST API's admin endpoints).
_ORIGINS = {"dns": "Dns", "peer_exchange": "PeerExchange", "discv5": "Discv5"}


def _hand_over(found: list[enr.Enr], relay: Relay | None, records: PeerRecords | None, metrics, origin: str) -> int:
    """Give the records ``found`` to peer exchange and the relay; returns
    how many peers were new to the relay."""
    added = 0
    for record in found:
        if records is not None:
            records.add(record)
        new = False
        if relay is not None:
            try:
                # relay_records kept only records of our cluster naming their shards.
                shards = record.relay_shards
                new = relay.add_discovered(
                    parse_peer(record.dialable()[0]),
                    _ORIGINS.get(origin, "UnknownOrigin"),
                    shards.shards if shards is not None else (),
                )
            except PeerAddressError as exc:
                log.debug("discovered address skipped: %s", exc)
        added += new
        if metrics is not None:
            metrics.discovered.labels(origin, "added" if new else "known").inc()
    return added


def _count_round(metrics, origin: str, outcome: str) -> None:
    if metrics is not None:
        metrics.discovery_rounds.labels(origin, outcome).inc()
