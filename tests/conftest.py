"""Shared fixtures: one embedded engine for the whole session."""

import pytest


@pytest.fixture(scope="session")
def engine():
    from wakustore.storage.engine import Engine

    engine = Engine("embedded")
    engine.start()
    try:
        yield engine
    finally:
        engine.close()
