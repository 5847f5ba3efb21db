"""Fixtures of the storage tests: every one runs on both engines (the
session's, tests/conftest.py)."""

import pytest

from wakustore.storage import schema
from wakustore.storage.message_store import MessageStore
from wakustore.storage.table import DeltaTableRef


@pytest.fixture(scope="session")
def engine(any_engine):
    return any_engine


@pytest.fixture
def table(engine, tmp_path):
    """A fresh, empty messages table on the engine."""
    t = DeltaTableRef(engine, str(tmp_path / "messages"))
    t.ensure(schema.MESSAGES, schema.MESSAGES_PARTITION, "test messages")
    return t


@pytest.fixture
def store(engine, tmp_path):
    """An opened message store on a fresh table; closed (committed) after the test."""
    s = MessageStore(DeltaTableRef(engine, str(tmp_path / "messages")), tmp_path / "wal")
    s.open()
    yield s
    s.close()
