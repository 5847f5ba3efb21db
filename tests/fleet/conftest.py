"""Servers the fleet tests share: one moto S3 server behind a gate, one
bucket, one Sail server in cluster mode and one Spark standalone cluster
with its Spark Connect server, both reaching it. Started once per session
(when a test asks for them); each
test module starts its own nodes on them and each test writes its own
content topic, so tests see only their own messages."""

from __future__ import annotations

import pytest

from tests.fleet.fleet import Gate, MotoServer, SailCluster, SparkCluster, s3_environment

BUCKET = "wakustore-fleet"


@pytest.fixture(scope="session")
def fleet_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fleet")


@pytest.fixture(scope="session")
def object_store(fleet_dir):
    """(moto server, gate in front of it); the bucket exists."""
    moto = MotoServer(fleet_dir / "moto.log").start()
    gate = None
    try:
        moto.create_bucket(BUCKET)
        gate = Gate(moto.port)
        yield moto, gate
    finally:
        if gate is not None:
            gate.close()
        moto.stop()


@pytest.fixture(scope="session")
def sail_cluster(fleet_dir, object_store):
    """Sail in cluster mode, able to reach the bucket (its driver and
    workers read and write the table themselves)."""
    cluster = SailCluster(fleet_dir / "sail-cluster.log", s3_environment(object_store[1].endpoint)).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def spark_cluster(fleet_dir, object_store):
    """A Spark standalone cluster (a master, two workers) and the fleet's
    one Spark Connect server with Delta on it, able to reach the bucket."""
    cluster = SparkCluster(fleet_dir / "spark-cluster", s3_environment(object_store[1].endpoint))
    try:
        yield cluster.start()
    finally:
        cluster.stop()
