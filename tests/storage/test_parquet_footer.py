"""A footer kept serialized reads every row group as the whole footer does."""

import glob
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from hypothesis import given, settings
from hypothesis import strategies as st

from wakustore.storage import maintenance, parquet_footer
from wakustore.storage.parquet_footer import FooterError, GroupFooters


def _rows(n: int) -> pa.Table:
    return pa.table(
        {
            "muid": pa.array([i.to_bytes(4, "big") * 8 for i in range(n)], pa.binary()),
            "content_topic": pa.array([f"/app/1/t{i % 7}/proto" for i in range(n)]),
            "payload": pa.array([os.urandom(50 + i % 300) for i in range(n)], pa.binary()),
            "timestamp": pa.array(range(n), pa.int64()),
            "meta": pa.array([None if i % 3 else b"m" for i in range(n)], pa.binary()),
        }
    )


def _walked(footers: GroupFooters, monkeypatch) -> GroupFooters:
    """The same footer split by walking every row group."""
    with monkeypatch.context() as patch:
        patch.setattr(parquet_footer, "_found_bounds", lambda *args: None)
        return GroupFooters(footers._footer)


def _every_group_equal(path: str, monkeypatch, found: bool = True) -> int:
    whole = pq.ParquetFile(path)
    footers = GroupFooters.of(whole.metadata)
    assert footers.num_row_groups == whole.metadata.num_row_groups
    # The row groups found by their first bytes are the walked ones.
    assert (footers._bounds == _walked(footers, monkeypatch)._bounds).all()
    assert (
        parquet_footer._found_bounds(footers._footer, int(footers._bounds[0]), footers.num_row_groups) is not None
    ) == found
    for group in range(footers.num_row_groups):
        alone = pq.ParquetFile(path, metadata=footers.metadata(group), pre_buffer=False)
        assert alone.metadata.num_row_groups == 1
        assert alone.read_row_group(0).equals(whole.read_row_group(group))
        assert alone.read_row_group(0, columns=["timestamp"]).equals(whole.read_row_group(group, columns=["timestamp"]))
    return footers.num_row_groups


def test_pyarrow_files_with_and_without_statistics(tmp_path, monkeypatch):
    rows = _rows(1000)
    for statistics in (True, False, ["timestamp"]):
        path = str(tmp_path / f"{statistics}.parquet")
        pq.write_table(rows, path, row_group_size=64, write_statistics=statistics)
        assert _every_group_equal(path, monkeypatch) == 16


def test_a_statistic_holding_a_row_group_start_is_walked(tmp_path, monkeypatch):
    """Values whose statistics hold the bytes a row group starts with (a
    STOP, then a list of the file's 5 columns): those row groups' bounds
    come from the walk, and read right."""
    rows = _rows(1000)
    start = b"\x00\x19\x5c"
    payload = [start + bytes([i % 256]) * 3 for i in range(1000)]
    rows = rows.set_column(rows.schema.get_field_index("payload"), "payload", pa.array(payload, pa.binary()))
    path = str(tmp_path / "f.parquet")
    pq.write_table(rows, path, row_group_size=64, write_statistics=True)
    assert start in GroupFooters.of(pq.ParquetFile(path).metadata)._footer[100:]
    assert _every_group_equal(path, monkeypatch, found=False) == 16


def test_compacted_delta_files_with_bloom_filters(tmp_path, monkeypatch):
    """The writer settings of a compacted day (delta-rs: bloom filters,
    page statistics, 256-row row groups), on more than 15 row groups (the
    list's size no longer fits its header byte)."""
    rows = _rows(5000)
    write_deltalake(str(tmp_path / "t"), rows, writer_properties=maintenance._writer_properties())
    [path] = glob.glob(str(tmp_path / "t" / "*.parquet"))
    assert _every_group_equal(path, monkeypatch) == 20


def test_footers_parse_as_files_without_pyarrow_unpickling(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_footer, "_unpickle", None)
    path = str(tmp_path / "f.parquet")
    pq.write_table(_rows(300), path, row_group_size=100)
    assert _every_group_equal(path, monkeypatch) == 3


def test_footer_memory_is_the_serialized_bytes(tmp_path):
    path = str(tmp_path / "f.parquet")
    pq.write_table(_rows(2000), path, row_group_size=32)
    metadata = pq.ParquetFile(path).metadata
    footers = GroupFooters.of(metadata)
    assert footers.nbytes < metadata.serialized_size + 8 * (metadata.num_row_groups + 1) + 64
    with pytest.raises(IndexError):
        footers.metadata(metadata.num_row_groups)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_split_or_raise_footer_error(data):
    try:
        GroupFooters(data)
    except FooterError:
        pass


@pytest.fixture(scope="module")
def footer_bytes(tmp_path_factory) -> bytes:
    path = str(tmp_path_factory.mktemp("d") / "f.parquet")
    pq.write_table(_rows(100), path, row_group_size=10)
    return GroupFooters.of(pq.ParquetFile(path).metadata)._footer


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_footers_split_or_raise_footer_error(footer_bytes, data):
    footer = bytearray(footer_bytes)
    at = data.draw(st.integers(0, len(footer) - 1))
    footer[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(footer)))
    try:
        GroupFooters(bytes(footer[:cut]))
    except FooterError:
        pass
