import pytest

from wakustore.node.config import ConfigError, load


def test_file_then_flags_then_environment(tmp_path):
    path = tmp_path / "node.toml"
    path.write_text('tcp_port = 61000\nws_port = 8100\nshards = [1, 2]\nretention = "capacity:10"\n')
    config = load(path, {"ws_port": 8200, "tcp_port": None}, environ={"WAKUSTORE_SHARDS": "5,6"})
    assert (config.tcp_port, config.ws_port, config.shards, config.retention) == (61000, 8200, [5, 6], "capacity:10")


@pytest.mark.parametrize(
    "values",
    [{"tcp_port": 70000}, {"engine": "postgres://x"}, {"retention": "forever"}, {"shards": [1024]}, {"bogus": 1}],
)
def test_bad_values_are_refused(values):
    with pytest.raises(ConfigError):
        load(None, values, environ={})


def test_unparsable_file_is_a_config_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("tcp_port = = 1")
    with pytest.raises(ConfigError):
        load(path, {}, environ={})
