"""Fixtures of the storage tests (the engine is the session's, tests/conftest.py)."""

import pytest

from wakustore.storage.message_store import MessageStore
from wakustore.storage.table import DeltaTableRef


@pytest.fixture
def store(engine, tmp_path):
    """An opened message store on a fresh table; closed (committed) after the test."""
    s = MessageStore(DeltaTableRef(engine, str(tmp_path / "messages")), tmp_path / "wal")
    s.open()
    yield s
    s.close()
