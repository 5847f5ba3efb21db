"""Node configuration: one TOML file, overridden by flags, overridden by
environment variables (``WAKUSTORE_<KEY>``, e.g. ``WAKUSTORE_TCP_PORT``)."""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wakustore.protocols.errors import ProtocolError

if TYPE_CHECKING:
    from wakustore.protocols.dos_protection import ProtectedTopic
    from wakustore.storage.engine import Engine

# What validate() checks with is imported there: the command line builds
# its parser (and --help, --version) from this module's defaults without
# loading the storage, transport and crypto code.

ENV_PREFIX = "WAKUSTORE_"
# storage.maintenance.DEFAULT_RETENTION (30 days), as a literal here so
# that reading the defaults loads no storage code (a test keeps them equal).
DEFAULT_RETENTION = "time:2592000"

# Caps on what peers may hold open (enforced by wakustore.node.limits, whose
# docstring says where each is checked). nwaku's --max-connections and
# --ip-colocation-limit defaults (waku/factory/external_config.nim).
DEFAULT_MAX_CONNECTIONS = 50
DEFAULT_IP_COLOCATION_LIMIT = 2
# A Noise handshake costs milliseconds of CPU and a stalled one would hold
# its slot until py-libp2p's 10 s upgrade timeout: past the cap a new
# handshake replaces the oldest in progress (an honest one takes
# milliseconds, so the oldest is a stalled one), and the per-address cap
# (ip_colocation_limit counts handshakes too) keeps one address to its share.
DEFAULT_MAX_HANDSHAKES = 16
# A connection with no stream open for this long is closed. nim-libp2p
# (so nwaku) closes a connection after 10 minutes without a byte
# (TcpTransport connectionsTimeout) and a stream after 5 (Connection's
# DefaultConnectionTimeout); bytes are no measure here, since both ends'
# yamux pings keep flowing on a connection nobody uses. Five minutes, as
# the node's wait for the first request on a stream: a client keeping
# idle request streams, a relay peer's gossipsub stream or js-libp2p's
# pings every 10 s keep a connection in use.
DEFAULT_IDLE_CONNECTION_TIMEOUT_S = 300.0
# All protocols together on one connection; js-waku needs one stream per
# protocol plus one per request in progress (nim-libp2p's mplex allows 200
# channels, more than a store node gives one peer).
DEFAULT_MAX_STREAMS_PER_CONNECTION = 64
# Opened but not written: js-waku keeps one such stream per protocol (five
# here: store v3 and legacy, lightpush v3 and legacy, metadata) for minutes.
DEFAULT_MAX_IDLE_STREAMS_PER_CONNECTION = 8
# Per protocol, all peers together: store queries run on the engine's few
# worker threads, so more at once only adds memory.
DEFAULT_MAX_REQUESTS_IN_FLIGHT = 64
# A whole request/response once its first byte is in: the rest of the
# request (10 s), the engine's page and writing a full 15 MB page over a
# slow link (30 s) (store_protocols.READ_TIMEOUT_S, WRITE_TIMEOUT_S).
DEFAULT_REQUEST_TIMEOUT_S = 60.0


# An import's decode workers: more than the cores only adds memory.
MAX_IMPORT_WORKERS = 16


class ConfigError(ValueError):
    """A configuration value that cannot be used; reported on one line."""


_LOG_ALIASES = {"warn": "warning", "fatal": "critical", "trace": "debug"}


@dataclass
class NodeConfig:
    data_dir: Path = Path("./data")
    # The log (cli/logs.py): level, any case; "json", "text", or "auto"
    # (text on a terminal, JSON lines otherwise). WAKUSTORE_LOG_LEVEL too.
    log_level: str = "INFO"
    log_format: str = "auto"
    # The engine the node starts and supervises on loopback: "sail" (the
    # default; "embedded" is the same) or "spark" (Apache Spark with Delta
    # Lake, a JVM); or "sc://host:port", a Spark Connect server (Spark with
    # Delta, or a Sail cluster) that a fleet shares.
    engine: str = "sail"
    # Where the tables live; default <data_dir>/tables. A fleet points every
    # node at the same location (shared file system or object store).
    table_root: str = ""
    # True when other nodes write the same table (a fleet): commits MERGE on
    # MUID and there is no in-memory hot tier. False: this node owns the
    # table, appends what its key filter has never seen, serves recent
    # history from memory.
    shared_table: bool = False
    tcp_port: int = 60000
    ws_port: int = 8000
    metrics_port: int = 8008
    mailserver_port: int = 30303
    listen_host: str = "0.0.0.0"
    # Metrics and /health answer on loopback only unless opened (nwaku's
    # --metrics-server-address default is 127.0.0.1 too).
    metrics_host: str = "127.0.0.1"
    # nwaku's REST API (node/rest.py): off unless asked; on loopback unless
    # opened; the admin endpoints only with rest_admin; CORS origins
    # allowed (nwaku's --rest-allow-origin: "*", or patterns with * and ?);
    # messages kept for GET /relay/v1/messages over all topics.
    rest: bool = False
    rest_address: str = "127.0.0.1"
    rest_port: int = 8645
    rest_admin: bool = False
    rest_allow_origin: list[str] = field(default_factory=list)
    rest_relay_cache_capacity: int = 50
    # Autosharding (51/WAKU2-RELAY-SHARDING): shards in the cluster that
    # content topics map to (nwaku's --num-shards-in-network); 0: static
    # sharding only, as Status uses it.
    num_shards_in_network: int = 0
    # Inbound libp2p connections, in total and per IP address (0: no cap);
    # handshakes in progress; seconds an inbound connection may stay with no
    # stream open; streams per connection (all, and request
    # streams opened but not yet written); requests served at once per
    # protocol; seconds a request/response may take once its first byte is in.
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    ip_colocation_limit: int = DEFAULT_IP_COLOCATION_LIMIT
    max_handshakes: int = DEFAULT_MAX_HANDSHAKES
    idle_connection_timeout_s: float = DEFAULT_IDLE_CONNECTION_TIMEOUT_S
    max_streams_per_connection: int = DEFAULT_MAX_STREAMS_PER_CONNECTION
    max_idle_streams_per_connection: int = DEFAULT_MAX_IDLE_STREAMS_PER_CONNECTION
    max_requests_in_flight: int = DEFAULT_MAX_REQUESTS_IN_FLIGHT
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    cluster_id: int = 16
    shards: list[int] = field(default_factory=lambda: [32])
    retention: str = DEFAULT_RETENTION
    flush_interval_s: float = 1.0
    flush_max_messages: int = 5000
    max_message_size: int = 150 * 1024
    # The embedded Sail server is restarted above this resident memory.
    engine_memory_ceiling_mb: int = 2048
    # The embedded Spark server's JVM heap (spark.driver.memory: "1g",
    # "2048m"); the JVM bounds itself, and exits on running out.
    spark_driver_memory: str = "1g"
    maintenance_interval_s: float = 3600.0
    # Data files a compaction or a retention removed from the table are
    # deleted by each maintenance run this many hours after their removal
    # (readers of older versions, a fleet's commits in flight); 0: never.
    vacuum_retention_hours: int = 168
    # Free space the data dir keeps: under it the node takes no message in
    # (node/disk.py), long before the file system is full; 0: no floor.
    min_free_bytes: int = 256 * 1024 * 1024
    # 11/WAKU2-RELAY on the configured shards (gossipsub, /vac/waku/relay/2.0.0).
    relay: bool = True
    # Multiaddrs (ending in /p2p/<peer id>) dialed at start and kept connected.
    relay_peers: list[str] = field(default_factory=list)
    # 33/WAKU2-DISCV5 (node/discv5.py): discv5 with protocol id d5waku on
    # this UDP port, bootstrapped from these records (enr:...), the
    # record's ip/udp updated from what peers see (nwaku's --discv5-*).
    discv5_discovery: bool = False
    discv5_udp_port: int = 9000
    discv5_bootstrap_nodes: list[str] = field(default_factory=list)
    discv5_enr_auto_update: bool = False
    # EIP-1459 trees (enrtree://<key>@<domain>) whose relay nodes of our
    # cluster and shards are dialed (nwaku's --dns-discovery-url), and the
    # name servers asked ("host" or "host:port"; none: the system's).
    dns_discovery_urls: list[str] = field(default_factory=list)
    dns_discovery_name_servers: list[str] = field(default_factory=list)
    # 34/WAKU2-PEER-EXCHANGE: hand light clients the records of the relay
    # nodes discovery found (nwaku's --peer-exchange).
    peer_exchange: bool = False
    # Nodes asked for relay peers by peer exchange while the relay has
    # fewer than PEER_EXCHANGE_WANTED (nwaku's --peer-exchange-node).
    peer_exchange_nodes: list[str] = field(default_factory=list)
    # 57/STATUS-Simple-Scaling: topics that only take messages signed by their
    # key. TOML: ["<pubsub topic>:<public key hex>", ...] or a table
    # {"<pubsub topic>" = "<public key hex>"}; parsed by validate().
    protected_topics: list[ProtectedTopic] = field(default_factory=list)
    # Per-peer and per-address limits in nwaku's --rate-limit format,
    # "[store|lightpush:]volume/period<h|m|s|ms>"; later entries win, none:
    # the defaults of node.rate_limits (store 60/2s, lightpush 5/1s).
    rate_limits: list[str] = field(default_factory=list)
    # Multiaddrs the node is reached at from outside (NAT, proxy), printed
    # and written to node-info.json after the listen addresses; nwaku's
    # --ext-multiaddr.
    ext_multiaddrs: list[str] = field(default_factory=list)
    # Waku Sync and Store Resume (node/sync.py): peers (multiaddrs ending in
    # /p2p/<peer id>) to reconcile with every sync_interval_s over the last
    # sync_range_s (nwaku's 5 min and 1 h), and to ask at start for what was
    # missed while down, at most resume_max_s back (store-sync.md: 6 h).
    sync_peers: list[str] = field(default_factory=list)
    sync_interval_s: float = 300.0
    sync_range_s: float = 3600.0
    resume_max_s: float = 21600.0

    # Control node of a community: export 7-day archives and seed them.
    # archive_key_file holds the community's 32-byte private key in hex.
    archive_key_file: str = ""
    archive_chat_ids: list[str] = field(default_factory=list)
    archive_dir: str = ""  # default <data_dir>/archives
    archive_layout: str = "status-go"
    archive_listen: str = "0.0.0.0:0"  # BitTorrent listen address
    # Member of communities: follow their magnet links (public keys, hex)
    # and import their archives; BitTorrent peers to dial besides the swarm.
    archive_follow: list[str] = field(default_factory=list)
    archive_seed_peers: list[str] = field(default_factory=list)
    # Worker processes that check and decode archives while a member
    # imports them, at most one a core: each ~280 MB at its peak; two
    # import ~25% faster than one on 2 cores (BENCHMARKS.md).
    archive_import_workers: int = 2

    @property
    def archives(self) -> Path:
        return Path(self.archive_dir) if self.archive_dir else self.data_dir / "archives"

    @property
    def tables(self) -> str:
        return self.table_root or str((self.data_dir / "tables").resolve())

    @property
    def messages_uri(self) -> str:
        return self.tables.rstrip("/") + "/messages"

    @property
    def envelopes_uri(self) -> str:
        return self.tables.rstrip("/") + "/envelopes"

    def validate(self) -> NodeConfig:
        from wakustore.node.rate_limits import RateLimits
        from wakustore.protocols import enr, topics
        from wakustore.protocols.dns_discovery import parse_url
        from wakustore.storage.maintenance import RetentionPolicy
        from wakustore.transport.dns import parse_name_server
        from wakustore.transport.peers import parse_peer

        try:
            RetentionPolicy.parse(self.retention)
        except ValueError as exc:
            raise ConfigError(f"retention: {exc}") from None
        if self.vacuum_retention_hours < 0:
            raise ConfigError(
                f"vacuum_retention_hours: must be 0 (never) or more hours, not {self.vacuum_retention_hours}"
            )
        for url in self.dns_discovery_urls:
            try:
                parse_url(url)
            except ProtocolError as exc:
                raise ConfigError(f"dns_discovery_url {url!r}: {exc}") from None
        for text in self.discv5_bootstrap_nodes:
            try:
                record = enr.decode(text)
            except ProtocolError as exc:
                raise ConfigError(f"discv5_bootstrap_node {text[:40]!r}: {exc}") from None
            if record.ip is None and record.ip6 is None or record.udp is None and record.udp6 is None:
                raise ConfigError(f"discv5_bootstrap_node {text[:40]!r}: the record has no IP address and UDP port")
        for addr in self.peer_exchange_nodes:
            try:
                parse_peer(addr)
            except ValueError as exc:
                raise ConfigError(f"peer_exchange_node: {exc}") from None
        for server in self.dns_discovery_name_servers:
            if parse_name_server(server) is None:
                raise ConfigError(f"dns_discovery_name_server {server!r} is not an IP address with an optional :port")
        if not (self.engine in ("sail", "spark", "embedded") or self.engine.startswith("sc://")):
            raise ConfigError(f"engine must be 'sail', 'spark' or 'sc://host:port', got {self.engine!r}")
        if not re.fullmatch(r"[1-9][0-9]*[kmgtKMGT]?", self.spark_driver_memory):
            raise ConfigError(
                f"spark_driver_memory must be a JVM size such as '1g' or '2048m', got {self.spark_driver_memory!r}"
            )
        for name in ("tcp_port", "ws_port", "metrics_port", "mailserver_port", "rest_port", "discv5_udp_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ConfigError(f"{name} {port} outside 0..65535")
        for name in (
            "max_connections",
            "ip_colocation_limit",
            "max_handshakes",
            "max_streams_per_connection",
            "max_idle_streams_per_connection",
            "max_requests_in_flight",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} {getattr(self, name)} is negative (0 turns the cap off)")
        if self.idle_connection_timeout_s < 0:
            raise ConfigError(f"idle_connection_timeout_s {self.idle_connection_timeout_s:g} is negative (0: never)")
        if self.request_timeout_s <= 0:
            raise ConfigError(f"request_timeout_s {self.request_timeout_s:g} must be positive")
        if not self.metrics_host.strip():
            raise ConfigError("metrics_host is empty")
        level = _LOG_ALIASES.get(self.log_level.strip().lower(), self.log_level.strip().lower())
        if level not in ("debug", "info", "warning", "error", "critical"):
            raise ConfigError(f"log_level {self.log_level!r}: one of debug, info, warning, error, critical")
        if self.log_format not in ("auto", "json", "text"):
            raise ConfigError(f"log_format {self.log_format!r}: one of auto, json, text")
        if not self.rest_address.strip():
            raise ConfigError("rest_address is empty")
        if not 1 <= self.rest_relay_cache_capacity <= 100_000:
            raise ConfigError(f"rest_relay_cache_capacity must be 1 to 100000, got {self.rest_relay_cache_capacity}")
        if not 0 <= self.num_shards_in_network <= 1024:
            raise ConfigError(f"num_shards_in_network must be 0 to 1024, got {self.num_shards_in_network}")
        if not 0 <= self.cluster_id <= 0xFFFF:
            raise ConfigError(f"cluster_id {self.cluster_id} outside 0..65535")
        if any(not 0 <= s < 1024 for s in self.shards):
            raise ConfigError("shards must lie in 0..1023")
        if not 1 <= self.archive_import_workers <= MAX_IMPORT_WORKERS:
            raise ConfigError(
                f"archive_import_workers must be 1 to {MAX_IMPORT_WORKERS}, got {self.archive_import_workers}"
            )
        if self.archive_layout not in ("status-go", "spec"):
            raise ConfigError(f"archive_layout must be 'status-go' or 'spec', got {self.archive_layout!r}")
        for pubkey in self.archive_follow:
            try:
                topics.community_id(bytes.fromhex(pubkey.removeprefix("0x")))
            except (ValueError, ProtocolError) as exc:
                raise ConfigError(f"archive_follow: {pubkey!r} is not a community public key ({exc})") from None
        try:
            parse_peers(self.archive_seed_peers)
        except ValueError as exc:
            raise ConfigError(f"archive_seed_peers: {exc}") from None
        if self.archive_key_file and not Path(self.archive_key_file).is_file():
            raise ConfigError(f"archive_key_file {self.archive_key_file} does not exist")
        if self.flush_interval_s <= 0 or self.flush_max_messages <= 0:
            raise ConfigError("flush interval and size must be positive")
        self.protected_topics = parse_protected_topics(self.protected_topics)
        for addr in self.ext_multiaddrs:
            import multiaddr  # py-libp2p's, loaded only when used
            import multiaddr.exceptions

            try:
                multiaddr.Multiaddr(addr)
            except (ValueError, multiaddr.exceptions.Error) as exc:
                raise ConfigError(f"ext_multiaddrs: {addr!r} is not a multiaddr ({exc})") from None
        if self.sync_interval_s <= 0 or self.sync_range_s <= 0 or self.resume_max_s < 0:
            raise ConfigError("sync_interval_s and sync_range_s must be positive, resume_max_s not negative")
        for addr in self.sync_peers:
            import multiaddr  # py-libp2p's, loaded only when used
            from libp2p.peer.peerinfo import info_from_p2p_addr

            try:
                info_from_p2p_addr(multiaddr.Multiaddr(addr))
            except Exception as exc:
                raise ConfigError(f"sync_peers: {addr!r} is not a multiaddr ending in /p2p/<peer id> ({exc})") from None
        if self.rate_limits:
            try:
                RateLimits.parse(self.rate_limits)
            except ValueError as exc:
                raise ConfigError(f"rate_limits: {exc}") from None
        return self


def new_engine(config: NodeConfig) -> Engine:
    """The engine ``config`` names, not started yet."""
    from wakustore.storage.engine import Engine

    return Engine(
        config.engine,
        memory_ceiling_bytes=config.engine_memory_ceiling_mb * 1024 * 1024,
        spark_driver_memory=config.spark_driver_memory,
        spark_s3=config.table_root.startswith(("s3://", "s3a://")),
    )


def parse_protected_topics(value: Any) -> list[ProtectedTopic]:
    """Protected topics from a TOML table ``{topic = key}``, a list of
    ``"topic:key"`` strings (or ProtectedTopic values), or one string of
    such entries separated by commas or spaces (the environment's form).
    Keys are 33- or 65-byte secp256k1 public keys in hex, ``0x`` optional."""
    from wakustore.protocols.dos_protection import ProtectedTopic

    if isinstance(value, str):
        value = value.replace(",", " ").split()
    entries: list[tuple[str, Any]]
    if isinstance(value, dict):
        entries = list(value.items())
    else:
        entries = []
        for item in value:
            if isinstance(item, ProtectedTopic):
                entries.append((item.pubsub_topic, item.public_key))
                continue
            topic, sep, text = str(item).rpartition(":")
            if not sep or not topic:
                raise ConfigError(f"protected_topics: expected <pubsub topic>:<public key hex>, got {item!r}")
            entries.append((topic, text))
    topics: dict[str, ProtectedTopic] = {}
    for topic, given in entries:
        key: Any = given
        if isinstance(key, str):
            digits = key[2:] if key[:2] in ("0x", "0X") else key
            try:
                key = bytes.fromhex(digits)
            except ValueError:
                raise ConfigError(f"protected_topics: key of {topic} is not hex") from None
        if topic in topics:
            raise ConfigError(f"protected_topics: {topic} is listed twice (one key per topic)")
        try:
            topics[topic] = ProtectedTopic(topic, bytes(key))
        except ProtocolError as exc:
            raise ConfigError(f"protected_topics: {exc}") from None
    return list(topics.values())


def load(path: Path | None, overrides: dict[str, Any], environ: Mapping[str, str] | None = None) -> NodeConfig:
    """File, then ``overrides`` (flags left unset are None), then environment."""
    config = NodeConfig()
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values.update(tomllib.loads(Path(path).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
    values.update({k: v for k, v in overrides.items() if v is not None})
    if environ is None:
        environ = os.environ
    fields = {f.name: f for f in dataclasses.fields(NodeConfig)}
    for name in fields:
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = raw
    for name, value in values.items():
        if name not in fields:
            raise ConfigError(f"unknown configuration key {name!r}")
        setattr(config, name, _coerce(name, getattr(config, name), value))
    return config.validate()


def _coerce(name: str, default: Any, value: Any) -> Any:
    if name == "protected_topics":
        return parse_protected_topics(value)
    if name in (
        "relay_peers",
        "dns_discovery_urls",
        "dns_discovery_name_servers",
        "peer_exchange_nodes",
        "archive_chat_ids",
        "archive_follow",
        "archive_seed_peers",
        "rate_limits",
        "ext_multiaddrs",
        "sync_peers",
        "rest_allow_origin",
        "discv5_bootstrap_nodes",
    ):
        return value.replace(",", " ").split() if isinstance(value, str) else [str(v) for v in value]
    try:
        if isinstance(default, Path):
            return Path(value)
        if isinstance(default, bool):
            return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, list):
            if isinstance(value, str):
                return [int(v) for v in value.replace(",", " ").split()]
            return [int(v) for v in value]
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not {_KIND.get(type(default), 'valid')}") from None


_KIND = {
    int: "an integer",
    float: "a number",
    list: "a list of integers (commas or spaces between them)",
    bool: "true or false",
}


def parse_peers(values: list[str]) -> tuple[tuple[str, int], ...]:
    """``host:port`` strings to (host, port) pairs; ValueError on a bad one."""
    peers = []
    for value in values:
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"not host:port: {value!r}")
        peers.append((host.strip("[]"), int(port)))
    return tuple(peers)
