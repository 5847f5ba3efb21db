"""Node configuration: one TOML file, overridden by flags, overridden by
environment variables (``WAKUSTORE_<KEY>``, e.g. ``WAKUSTORE_TCP_PORT``)."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wakustore.storage.maintenance import DEFAULT_RETENTION, RetentionPolicy

ENV_PREFIX = "WAKUSTORE_"


class ConfigError(ValueError):
    """A configuration value that cannot be used; reported on one line."""


@dataclass
class NodeConfig:
    data_dir: Path = Path("./data")
    # "embedded" (a supervised Sail server) or "sc://host:port".
    engine: str = "embedded"
    # Where the tables live; default <data_dir>/tables. A fleet points every
    # node at the same location (shared file system or object store).
    table_root: str = ""
    tcp_port: int = 60000
    ws_port: int = 8000
    metrics_port: int = 8008
    mailserver_port: int = 30303
    listen_host: str = "0.0.0.0"
    cluster_id: int = 16
    shards: list[int] = field(default_factory=lambda: [32])
    retention: str = DEFAULT_RETENTION
    flush_interval_s: float = 1.0
    flush_max_messages: int = 5000
    max_message_size: int = 150 * 1024
    engine_memory_ceiling_mb: int = 2048
    maintenance_interval_s: float = 3600.0

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
        try:
            RetentionPolicy.parse(self.retention)
        except ValueError as exc:
            raise ConfigError(f"retention: {exc}") from None
        if not (self.engine == "embedded" or self.engine.startswith("sc://")):
            raise ConfigError(f"engine must be 'embedded' or 'sc://host:port', got {self.engine!r}")
        for name in ("tcp_port", "ws_port", "metrics_port", "mailserver_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ConfigError(f"{name} {port} outside 0..65535")
        if not 0 <= self.cluster_id <= 0xFFFF:
            raise ConfigError(f"cluster_id {self.cluster_id} outside 0..65535")
        if any(not 0 <= s < 1024 for s in self.shards):
            raise ConfigError("shards must lie in 0..1023")
        if self.flush_interval_s <= 0 or self.flush_max_messages <= 0:
            raise ConfigError("flush interval and size must be positive")
        return self


def load(path: Path | None, overrides: dict[str, Any], environ: dict[str, str] | None = None) -> NodeConfig:
    """File, then ``overrides`` (flags left unset are None), then environment."""
    config = NodeConfig()
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values.update(tomllib.loads(Path(path).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
    values.update({k: v for k, v in overrides.items() if v is not None})
    environ = os.environ if environ is None else environ
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
        raise ConfigError(f"{name}: cannot use {value!r}") from None
