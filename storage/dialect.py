"""Where the two engines differ: Sail, and Apache Spark with Delta Lake.

Everything else in storage/ speaks the Spark Connect API and the SQL both
accept. What one engine does and the other does not, or does in its own
words, is decided here and nowhere else; ``tests/storage/test_dialect.py``
holds each difference against the real engines.

| what | Sail (pysail 0.7) | Spark 4.2 + Delta 4.4 |
|---|---|---|
| ``SELECT version()`` | its own release, one word (``0.7.2``) | Spark's release and git revision, two words |
| ``OPTIMIZE``, ``VACUUM``, ``DESCRIBE HISTORY`` | not parsed | Delta SQL |
| ``CREATE TABLE delta.`path` ... TBLPROPERTIES`` | refused | creates the table |
| a MERGE's answer | one ``count`` column: rows written | ``num_affected_rows``, ``num_inserted_rows``, ... |
| a lost commit race | ``Failed to commit transaction: <version>``, no condition | error conditions ``DELTA_CONCURRENT_*`` |
| a Delta write's file size | option ``targetFileSize`` (bytes) | Spark's ``maxRecordsPerFile`` (rows) |
"""

from __future__ import annotations

import contextlib
import re

SAIL = "sail"
SPARK = "spark"
KINDS = (SAIL, SPARK)


def kind_of_version(version: str) -> str:
    """The engine behind a Spark Connect endpoint, from what ``SELECT
    version()`` answered: Spark documents two fields (release and git
    revision); Sail answers its own release alone."""
    return SPARK if len(version.split()) >= 2 else SAIL


def has_optimize(kind: str | None) -> bool:
    """Whether the engine runs Delta's ``OPTIMIZE`` and ``VACUUM`` (None:
    not known yet; callers then try and use :func:`lacks_optimize`)."""
    return kind != SAIL


def lacks_optimize(exc: BaseException) -> bool:
    """Whether ``exc`` is Sail's refusal to parse ``OPTIMIZE``/``VACUUM``."""
    return "found OPTIMIZE" in str(exc) or "found VACUUM" in str(exc)


def creates_path_tables(kind: str | None) -> bool:
    """Whether ``CREATE TABLE delta.`path` ... TBLPROPERTIES`` works; where
    it does not, an empty append creates the table."""
    return kind != SAIL


def inserted_rows(result: list) -> int:
    """Rows a MERGE (inserts only) wrote, from the one row it answers."""
    if not result:
        raise RuntimeError("the engine reported no outcome for a MERGE")
    row = result[0].asDict()
    if "num_inserted_rows" in row:
        return int(row["num_inserted_rows"])
    return int(row.get("count", next(iter(row.values()))))


# What a message row takes in a data file, for a bound in rows: the three
# 32-byte hashes, topics and payload of status.prod's traffic (~1 KiB).
ROW_BYTES_ESTIMATE = 1024


def window_write_options(kind: str | None, target_file_bytes: int) -> dict[str, str]:
    """Options of a Delta write that replaces a window, for files of about
    ``target_file_bytes``: Sail keeps an open file per partition and core
    buffered up to its target size (see table.REPLACE_TARGET_FILE_BYTES);
    Spark has no size option for Delta writes, and rolls a task's file at a
    row count."""
    if kind == SAIL:
        return {"targetFileSize": str(target_file_bytes)}
    return {"maxRecordsPerFile": str(max(1, target_file_bytes // ROW_BYTES_ESTIMATE))}


# --- commit conflicts --------------------------------------------------------

# Another writer committed to the table first; the commit may be retried
# after re-reading. Spark with Delta names them by error condition
# (DELTA_CONCURRENT_APPEND, ...); Sail (pysail 0.7.2) sends a
# SparkRuntimeException without a condition whose text is "Failed to commit
# transaction: <version>" (seen with two writers on one table), and "Missing
# commit file" when it listed the log while another writer added to it (a
# re-read succeeds).
_CONFLICT_CONDITIONS = ("DELTA_CONCURRENT", "DELTA_METADATA_CHANGED", "DELTA_PROTOCOL_CHANGED")
_CONFLICT_TEXT = re.compile(
    r"(?i)concurrent|conflict|failed to commit transaction|version \d+ already exists|"
    r"transaction.*(retry|failed)|ProtocolChanged|MetadataChanged|missing commit file"
)


def is_commit_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` says another writer committed first (either engine)."""
    condition = None
    get_condition = getattr(exc, "getCondition", None)
    if callable(get_condition):
        with contextlib.suppress(Exception):
            condition = get_condition()
    if condition and condition.startswith(_CONFLICT_CONDITIONS):
        return True
    return bool(_CONFLICT_TEXT.search(f"{type(exc).__name__}: {exc}"))
