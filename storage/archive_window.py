"""What community archive export reads from the messages table besides its
windows (:meth:`MessageStore.stream_window`): where the history starts."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from wakustore.storage.table import DeltaTableRef, sql_string

log = logging.getLogger(__name__)


def oldest_timestamp_ns(table: DeltaTableRef, content_topics: Sequence[str]) -> int | None:
    """The sender timestamp (ns) of the oldest committed message on
    ``content_topics``; None when there is none (or no table yet). The
    caller commits the buffer first if pending messages should count."""
    if not content_topics:
        return None
    # {table} is the only placeholder: braces in a topic are doubled.
    listed = ", ".join(sql_string(t).replace("{", "{{").replace("}", "}}") for t in content_topics)
    try:
        oldest = table.scalar(f"SELECT min(timestamp) FROM {{table}} WHERE content_topic IN ({listed})")
    except Exception as exc:  # no table yet: nothing to archive
        log.debug("no oldest message: %s", exc)
        return None
    return None if oldest is None else int(oldest)
