import pytest

from wakustore.node.config import ConfigError, load


def test_file_then_flags_then_environment(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text('tcp_port = 61000\nws_port = 8100\nshards = [1, 2]\nretention = "capacity:10"\n')
    config = load(path, {"ws_port": 8200, "tcp_port": None}, environ={"WAKUSTORE_SHARDS": "5,6"})
    assert (config.tcp_port, config.ws_port, config.shards, config.retention) == (61000, 8200, [5, 6], "capacity:10")


@pytest.mark.parametrize(
    "values",
    [
        {"tcp_port": 70000},
        {"engine": "postgres://x"},
        {"retention": "forever"},
        {"shards": [1024]},
        {"bogus": 1},
        {"archive_import_workers": 0},
        {"archive_import_workers": 17},
        {"vacuum_retention_hours": -1},
    ],
)
def test_bad_values_are_refused(values):
    with pytest.raises(ConfigError):
        load(None, values, environ={})


def test_unparsable_file_is_a_config_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("tcp_port = = 1")
    with pytest.raises(ConfigError):
        load(path, {}, environ={})


def test_rate_limits_from_the_file_the_flag_and_the_environment(tmp_path):
    from wakustore.node.store_protocols import RateLimit, RateLimits

    path = tmp_path / "node.toml"
    path.write_text('rate_limits = ["store:10/1s", "lightpush:2/1m"]\n')
    from_file = load(path, {"rate_limits": None}, environ={})
    assert from_file.rate_limits == ["store:10/1s", "lightpush:2/1m"]
    assert RateLimits.parse(from_file.rate_limits) == RateLimits(RateLimit(10, 1.0), RateLimit(2, 60.0))
    # the flag (repeatable) replaces the file's list
    from_flag = load(path, {"rate_limits": ["store:0/1s"]}, environ={})
    assert from_flag.rate_limits == ["store:0/1s"]
    # the environment's list: entries separated by commas or spaces
    from_env = load(path, {}, environ={"WAKUSTORE_RATE_LIMITS": "store:7/2s, lightpush:3/1s"})
    assert RateLimits.parse(from_env.rate_limits) == RateLimits(RateLimit(7, 2.0), RateLimit(3, 1.0))
    assert load(None, {}, environ={}).rate_limits == []


@pytest.mark.parametrize("source", ["file", "flag", "environment"])
def test_bad_rate_limit_is_a_config_error_from_every_source(tmp_path, source):
    path = tmp_path / "node.toml"
    path.write_text('rate_limits = ["store:ten/1s"]\n' if source == "file" else "")
    overrides = {"rate_limits": ["60/2 s"]} if source == "flag" else {}
    environ = {"WAKUSTORE_RATE_LIMITS": "lightpush:5/1y"} if source == "environment" else {}
    with pytest.raises(ConfigError, match="rate_limits: rate limit"):
        load(path, overrides, environ=environ)


def test_every_configuration_key_is_in_the_readme_table():
    import dataclasses
    import pathlib

    from wakustore.node.config import NodeConfig

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    keys = {
        cell.strip("`")
        for row in table.splitlines()
        if row.startswith("| `")
        for cell in row.split("|")[1].replace(",", " ").split()
    }
    assert {f.name for f in dataclasses.fields(NodeConfig)} <= keys, {
        f.name for f in dataclasses.fields(NodeConfig)
    } - keys


def test_ext_multiaddrs_from_the_file_the_flag_and_the_environment(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text('ext_multiaddrs = ["/ip4/203.0.113.5/tcp/60000"]\n')
    assert load(path, {}, environ={}).ext_multiaddrs == ["/ip4/203.0.113.5/tcp/60000"]
    assert load(path, {"ext_multiaddrs": ["/dns4/a.example/tcp/443/wss"]}, environ={}).ext_multiaddrs == [
        "/dns4/a.example/tcp/443/wss"
    ]
    env = {"WAKUSTORE_EXT_MULTIADDRS": "/ip4/203.0.113.6/tcp/1,/ip4/203.0.113.7/tcp/2"}
    assert load(path, {}, environ=env).ext_multiaddrs == ["/ip4/203.0.113.6/tcp/1", "/ip4/203.0.113.7/tcp/2"]
    with pytest.raises(ConfigError, match="ext_multiaddrs: 'nowhere'"):
        load(None, {"ext_multiaddrs": ["nowhere"]}, environ={})


def test_archive_import_workers_from_the_environment(tmp_path):
    assert load(None, {}, environ={}).archive_import_workers == 2
    assert load(None, {}, environ={"WAKUSTORE_ARCHIVE_IMPORT_WORKERS": "1"}).archive_import_workers == 1
    with pytest.raises(ConfigError, match="archive_import_workers must be 1 to 16, got 0"):
        load(None, {}, environ={"WAKUSTORE_ARCHIVE_IMPORT_WORKERS": "0"})
