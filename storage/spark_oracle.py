"""The Store semantics evaluated by the engine: one Spark Connect query a
page, over the Delta table as the engine reads it.

The node never reads pages this way (storage.reader answers from the
table's files in process, storage.hot_tier and the write path from
memory). This is the independent oracle those are checked against: the
tests compare their pages with it, and ``bench store`` crosschecks its
answers and measures the engine's time beside the node's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pyarrow as pa

from wakustore.protocols import store_query
from wakustore.protocols.store_query import HistoryQuery
from wakustore.storage import schema
from wakustore.storage.table import DeltaTableRef, fetch_arrow


class SparkPages:
    """Pages and cursor lookups of ``table`` read by its engine."""

    def __init__(self, table: DeltaTableRef) -> None:
        self.table = table

    def page(self, query: HistoryQuery, key: tuple[int, bytes] | None, fetch: int) -> pa.Table:
        """Up to ``fetch`` rows after/before ``key`` in query order (not reversed)."""
        from pyspark.sql import functions as F

        preds, after = store_query.predicates(query, key)
        columns = list(schema.page_columns(query.include_data, bool(query.message_hashes)))
        order_col = store_query.order_column(query.ordering)

        def run(spark):
            frame = spark.read.format("delta").load(self.table.uri)
            condition = _query_condition(F, preds, after)
            if condition is not None:
                frame = frame.where(condition)
            orders = [F.col(store_query.TIMESTAMP), F.col(order_col)]
            orders = [c.asc() for c in orders] if query.forward else [c.desc() for c in orders]
            return frame.select(*columns).orderBy(*orders).limit(fetch)

        return self.table.engine.run(lambda spark: fetch_arrow(run(spark)))

    def timestamp_of_hash(self, message_hash: bytes, pubsub_topic: str | None) -> int | None:
        from pyspark.sql import functions as F

        def run(spark):
            frame = spark.read.format("delta").load(self.table.uri).where(F.col("message_hash") == F.lit(message_hash))
            if pubsub_topic is not None:
                frame = frame.where(F.col("pubsub_topic") == F.lit(pubsub_topic))
            return frame.select("timestamp").limit(1)

        found = self.table.engine.run(lambda spark: fetch_arrow(run(spark)))
        return found.column(0)[0].as_py() if found.num_rows else None


def _query_condition(F, preds: Sequence[store_query.Predicate], after: store_query.After | None):
    """The Spark condition of a query's description (None: every row), with
    the day partitions pruned from the timestamp bounds (a row's day is the
    UTC day of its timestamp)."""
    parts = []
    for p in preds:
        column = F.col(p.column)
        if p.op == store_query.EQ:
            parts.append(column == F.lit(p.value))
        elif p.op == store_query.IN:
            parts.append(column.isin(list(cast("tuple[Any, ...]", p.value))))  # "in": a tuple
        elif p.op == store_query.GE:
            parts.append(column >= F.lit(p.value))
        elif p.op == store_query.LT:
            parts.append(column < F.lit(p.value))
        else:
            raise ValueError(f"unknown predicate operator {p.op!r}")
        if p.column == store_query.TIMESTAMP and p.op in (store_query.GE, store_query.LT):
            parts.append(_day_bound(F, p.op, cast(int, p.value)))  # a timestamp bound: an int
    if after is not None:
        ts, key = F.col(store_query.TIMESTAMP), F.col(after.column)
        if after.forward:
            parts.append((ts > F.lit(after.timestamp)) | ((ts == F.lit(after.timestamp)) & (key > F.lit(after.key))))
        else:
            parts.append((ts < F.lit(after.timestamp)) | ((ts == F.lit(after.timestamp)) & (key < F.lit(after.key))))
        # Rows after the cursor lie on its day or later (before it: on its
        # day or earlier): the other days need not be opened.
        parts.append(
            _day_bound(
                F,
                store_query.GE if after.forward else store_query.LT,
                after.timestamp if after.forward else after.timestamp + 1,
            )
        )
    condition = None
    for part in parts:
        condition = part if condition is None else condition & part
    return condition


def _day_bound(F, op: str, timestamp: int):
    """The day-partition condition implied by ``timestamp op value``."""
    day = F.col(schema.MESSAGES_PARTITION)
    if op == store_query.GE:
        return day >= F.lit(schema.day_of_ns(timestamp))
    return day <= F.lit(schema.day_of_ns(max(timestamp - 1, 0)))
