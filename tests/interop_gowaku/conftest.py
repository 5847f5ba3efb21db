"""Fixtures of the go-waku interop tests.

``gowaku_binary``: go-waku's node, built when missing (gowaku_build.py); a
failed or timed-out build fails the tests that need it, loudly.
``statusgo_binary``: the status-go store client harness, the same way.

``ours`` and ``gowaku``: one node of each per test module, on the module's
``CLUSTER_ID`` and ``SHARDS``. Our node runs relay when the module sets
``OUR_RELAY``, takes ``OUR_CONFIG`` (NodeConfig fields) and has no rate
limits; go-waku subscribes to the module's shards and takes the flags that
the module's ``gowaku_flags(ours)`` returns, if it has one.
"""

import sys
from pathlib import Path

import pytest

from wakustore.node.store_protocols import RateLimits

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from gowaku_build import GoWakuBuildError, ensure_gowaku, ensure_statusgo  # noqa: E402
from gowaku_node import GoWaku  # noqa: E402
from our_node import RelayNode  # noqa: E402
from store_node_harness import NodeThread, node_config  # noqa: E402


@pytest.fixture(scope="session")
def gowaku_binary() -> Path:
    return _built(ensure_gowaku, "go-waku")


@pytest.fixture(scope="session")
def statusgo_binary() -> Path:
    return _built(ensure_statusgo, "the status-go harness")


def _built(ensure, what: str) -> Path:
    try:
        return ensure()
    except GoWakuBuildError as exc:
        pytest.fail(f"{what} could not be built: {exc}", pytrace=False)


@pytest.fixture(scope="module")
def ours(engine, request, tmp_path_factory):
    module = request.module
    config = node_config(
        tmp_path_factory.mktemp("ours"),
        cluster_id=module.CLUSTER_ID,
        shards=list(module.SHARDS),
        **getattr(module, "OUR_CONFIG", {}),
    )
    node_class = RelayNode if getattr(module, "OUR_RELAY", False) else NodeThread
    node = node_class(config, engine, RateLimits.parse(["0/1s"])).start()
    yield node
    node.stop()


@pytest.fixture(scope="module")
def gowaku(gowaku_binary, ours, request, tmp_path_factory):
    module = request.module
    flags = module.gowaku_flags(ours) if hasattr(module, "gowaku_flags") else []
    node = GoWaku(
        gowaku_binary,
        tmp_path_factory.mktemp("gowaku"),
        cluster_id=module.CLUSTER_ID,
        pubsub_topics=[f"/waku/2/rs/{module.CLUSTER_ID}/{shard}" for shard in module.SHARDS],
        flags=flags,
    ).start()
    yield node
    node.stop()
