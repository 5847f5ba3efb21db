"""Rows read by data page (storage/parquet_pages.py) equal pyarrow's own reads."""

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wakustore.storage import parquet_pages, window_files
from wakustore.storage.parquet_footer import FooterError, GroupFooters
from wakustore.storage.parquet_pages import PAGE_ROWS

ROWS = 1000  # 3 full row groups of 256 and one of 232 (its last page of 8 rows)
GROUP_ROWS = 256


def _messages(n: int, seed: int = 1) -> pa.Table:
    rng = random.Random(seed)
    columns = {}
    for field in window_files._PHYSICAL:
        if field.name in ("pubsub_topic", "content_topic"):
            columns[field.name] = pa.array([f"/{field.name}/{rng.randrange(5)}" for _ in range(n)], field.type)
        elif pa.types.is_binary(field.type):
            # Payloads of every size a page may hold, some empty.
            size = {"payload": 3000, "meta": 64, "rate_limit_proof": 40}.get(field.name, 32)
            columns[field.name] = pa.array([rng.randbytes(rng.randrange(size + 1)) for _ in range(n)], field.type)
        else:
            columns[field.name] = pa.array([rng.randrange(1 << 30) for _ in range(n)], field.type)
    return pa.table(columns, schema=window_files._PHYSICAL)


def _write(path, table: pa.Table, paged: bool = True) -> None:
    writer = pq.ParquetWriter(
        str(path),
        window_files._PHYSICAL,
        compression=window_files._COMPRESSION,
        use_dictionary=window_files._DICTIONARY_COLUMNS,
        write_statistics=list(window_files._STATS_COLUMNS),
        **(parquet_pages.write_options() if paged else {}),
    )
    writer.write_table(table, row_group_size=GROUP_ROWS)
    writer.close()


class _File:
    def __init__(self, path, metadata=None):
        self.path = path
        self.metadata = metadata or pq.ParquetFile(str(path)).metadata
        self.footers = GroupFooters.of(self.metadata)
        self.source = pa.OSFile(str(path))
        self.starts = np.cumsum(
            [0] + [self.metadata.row_group(g).num_rows for g in range(self.metadata.num_row_groups)]
        )
        self.reads: list[int] = []

    def read_at(self, offset: int, size: int) -> bytes:
        self.reads.append(size)
        return self.source.read_at(size, offset)

    def section(self):
        return parquet_pages.page_section(self.footers, self.read_at, self.metadata)

    def rows(self, rows, columns):
        pages = self.section()
        assert pages is not None
        rows = np.array(sorted(rows), dtype=np.int64)
        groups = np.searchsorted(self.starts, rows, "right") - 1
        wanted = []
        for group in np.unique(groups).tolist():
            first = int(self.starts[group])
            wanted.append((group, int(self.starts[group + 1]) - first, rows[groups == group] - first))
        self.reads.clear()
        return parquet_pages.read_rows(parquet_pages.Template(self.footers), pages, self.read_at, wanted, columns)


@pytest.fixture(scope="module")
def paged(tmp_path_factory):
    path = tmp_path_factory.mktemp("pages") / "paged.parquet"
    table = _messages(ROWS)
    _write(path, table)
    return _File(path), table


def test_a_paged_file_has_pages_of_page_rows_in_every_column(paged):
    file, _ = paged
    pages = file.section()
    assert pages is not None and pages.shape == (4, len(window_files._PHYSICAL), parquet_pages.SLOTS)
    # Dictionary pages for the two topic columns only.
    names = [f.name for f in window_files._PHYSICAL]
    with_dictionary = {names[c] for c in range(len(names)) if pages[0, c, 0] >= 0}
    assert with_dictionary == {"pubsub_topic", "content_topic"}
    # The last row group: 232 rows, 15 pages, its end after them.
    assert (pages[3, :, 2 : 2 + 15] > 0).all() and (pages[3, :, 2 + 16] == -1).all()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_rows_and_columns_equal_pyarrows_read(paged, data):
    file, table = paged
    rows = data.draw(st.sets(st.integers(0, ROWS - 1), min_size=1, max_size=80))
    names = [f.name for f in window_files._PHYSICAL]
    columns = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
    got = file.rows(rows, columns)
    assert got.equals(table.take(pa.array(sorted(rows))).select(columns))


def test_a_lookup_reads_its_pages_not_its_row_groups(paged):
    file, table = paged
    rows = [3, 300, 700, 999]  # four row groups, one page each
    got = file.rows(rows, ["payload", "content_topic"])
    assert got.equals(table.take(pa.array(rows)).select(["payload", "content_topic"]))
    payload_group = file.metadata.row_group(1).column(5).total_compressed_size
    # One payload page (~16 of 256 rows) and a dictionary page and a data
    # page of content topics per row group.
    assert len(file.reads) == 4 * 3
    assert sum(file.reads) < 4 * payload_group * 2 * PAGE_ROWS / GROUP_ROWS


def test_files_without_aligned_pages_have_no_page_section(tmp_path):
    path = tmp_path / "groups.parquet"
    _write(path, _messages(600), paged=False)
    assert _File(path).section() is None


def test_a_damaged_offset_index_is_refused_or_read_as_written(paged, tmp_path):
    """Bits flipped in the offset indexes: the section is refused (None or
    FooterError), or every page it names is where the footer's chunks say,
    so the rows read are the rows written."""
    file, table = paged
    raw = file.path.read_bytes()
    end = len(raw) - 8 - file.metadata.serialized_size  # the offset indexes end where the footer starts
    outcomes = set()
    for seed in range(40):
        damaged = bytearray(raw)
        rng = random.Random(seed)
        for _ in range(4):
            damaged[rng.randrange(end - 1500, end)] ^= 1 << rng.randrange(8)
        path = tmp_path / "damaged.parquet"
        path.write_bytes(bytes(damaged))
        other = _File(path, file.metadata)
        try:
            pages = other.section()
        except (FooterError, IndexError):
            outcomes.add("error")
            continue
        if pages is None:
            outcomes.add("refused")
            continue
        outcomes.add("read")
        assert other.rows([0, 500, 999], ["payload"]).equals(table.take(pa.array([0, 500, 999])).select(["payload"]))
    assert outcomes & {"error", "refused"}
