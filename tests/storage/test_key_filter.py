"""Bloom filters over table keys: never a false negative, few false positives."""

import datetime as dt
import hashlib

from wakustore.storage.key_filter import DayKeyFilter, KeyFilter

DAY = dt.date(2026, 11, 1)


def keys(prefix: bytes, count: int) -> list[bytes]:
    return [hashlib.sha256(prefix + i.to_bytes(4, "big")).digest() for i in range(count)]


def test_key_filter_has_no_false_negatives_and_about_its_rate_of_false_positives():
    f = KeyFilter(capacity=20_000, fpp=0.01)
    added = keys(b"in", 20_000)
    f.add(added)
    assert f.might_contain(added).all()
    false_positives = f.might_contain(keys(b"out", 20_000)).mean()
    assert false_positives < 0.02


def test_day_filter_names_every_day_a_key_was_added_on():
    f = DayKeyFilter(capacity_per_day=1_000, capacity=10_000)
    first, second = keys(b"a", 500), keys(b"b", 500)
    f.add(first, [DAY] * 500)
    f.add(second, [DAY + dt.timedelta(days=1)] * 500)
    f.add(first[:10], [DAY + dt.timedelta(days=3)] * 10)  # sent again, days later
    days = f.candidate_days(first + second)
    assert all(DAY in d for d in days[:500]) and all(DAY + dt.timedelta(days=1) in d for d in days[500:])
    assert all(DAY + dt.timedelta(days=3) in d for d in days[:10])
    unknown = f.candidate_days(keys(b"new", 5_000))
    assert sum(1 for d in unknown if d) < 5  # behind a 1% filter, then 1e-4 per day


def test_day_filter_forgets_days_that_retention_removed():
    f = DayKeyFilter(capacity_per_day=1_000, capacity=10_000)
    old, recent = keys(b"old", 100), keys(b"recent", 100)
    f.add(old, [DAY] * 100)
    f.add(recent, [DAY + dt.timedelta(days=2)] * 100)
    f.drop_days_before(DAY + dt.timedelta(days=1))
    assert not any(f.candidate_days(old))
    assert all(f.candidate_days(recent))
    f.clear()
    assert not any(f.candidate_days(recent))


def test_sizing_follows_the_bloom_formulas_rounded_up_to_a_power_of_two():
    import math

    f = KeyFilter(capacity=100_000, fpp=0.01)
    needed = -100_000 * math.log(0.01) / math.log(2) ** 2
    assert f.bits & (f.bits - 1) == 0 and needed <= f.bits < 2 * needed
    assert f.probes == math.ceil(-math.log2(0.01))  # capped at what the rate asks for
    assert KeyFilter(capacity=1, fpp=0.5).bits >= 64


def test_a_tighter_rate_holds_at_capacity():
    f = KeyFilter(capacity=20_000, fpp=1e-3)
    f.add(keys(b"in", 20_000))
    assert f.might_contain(keys(b"out", 100_000)).mean() < 2e-3


def test_past_its_capacity_the_rate_rises_but_nothing_is_ever_missed():
    f = KeyFilter(capacity=2_000, fpp=0.01)
    added = keys(b"in", 10_000)  # five times the capacity
    f.add(added)
    assert f.might_contain(added).all()
    rate = f.might_contain(keys(b"out", 20_000)).mean()
    assert 0.02 < rate < 1.0
    assert f.count == 10_000


def test_empty_batches_and_short_keys():
    f = KeyFilter(capacity=1_000, fpp=0.01)
    f.add([])
    assert f.might_contain([]).shape == (0,) and f.count == 0
    short = [b"", b"\x01", b"sixteen-bytes-no"]  # padded to 16 bytes: still found
    f.add(short)
    assert f.might_contain(short).all()
    day_filter = DayKeyFilter(capacity_per_day=100, capacity=1_000)
    assert day_filter.candidate_days([]) == []
    assert day_filter.candidate_days(keys(b"x", 3)) == [set(), set(), set()]  # no day yet


def test_dropping_days_keeps_the_boundary_day_and_later_adds():
    f = DayKeyFilter(capacity_per_day=1_000, capacity=10_000)
    on_day, day_after = keys(b"d0", 50), keys(b"d1", 50)
    f.add(on_day, [DAY] * 50)
    f.add(day_after, [DAY + dt.timedelta(days=1)] * 50)
    f.drop_days_before(DAY)  # nothing before DAY
    assert all(DAY in d for d in f.candidate_days(on_day))
    f.drop_days_before(DAY + dt.timedelta(days=1))
    assert not any(f.candidate_days(on_day))
    assert all(d == {DAY + dt.timedelta(days=1)} for d in f.candidate_days(day_after))
    f.add(on_day[:5], [DAY] * 5)  # the day comes back when a key is added on it again
    assert all(DAY in d for d in f.candidate_days(on_day[:5]))


def test_candidates_name_only_the_keys_some_day_may_hold():
    f = DayKeyFilter(capacity_per_day=1_000, capacity=10_000)
    old = keys(b"old", 300)
    f.add(old, [DAY] * 300)
    batch = keys(b"fresh", 2_000) + old[:5]
    found = f.candidates(batch)
    assert all(found.get(i) == {DAY} for i in range(2_000, 2_005))
    assert len(found) < 2_005 + 20  # a few false positives at most
    assert f.candidate_days(batch) == [found.get(i, set()) for i in range(len(batch))]


def test_adding_arrow_columns_sets_the_bits_adding_keys_and_days_sets():
    import pyarrow as pa

    keys = [hashlib.sha256(b"%d" % i).digest() + b"meta" * (i % 3) for i in range(3000)]
    days = [dt.date(2026, 11, 1 + i % 7) for i in range(3000)]
    by_lists, by_columns = DayKeyFilter(1000), DayKeyFilter(1000)
    by_lists.add(keys, days)
    by_columns.add_columns(
        pa.chunked_array([pa.array(keys[:1000]), pa.array(keys[1000:])]), pa.array(days, pa.date32())
    )
    assert (by_lists._all._array == by_columns._all._array).all()
    assert by_lists._days.keys() == by_columns._days.keys()
    for day in by_lists._days:
        assert (by_lists._days[day]._array == by_columns._days[day]._array).all()
        assert by_lists._days[day].count == by_columns._days[day].count
    found = by_columns.candidate_days(keys[:50])
    assert found == by_lists.candidate_days(keys[:50]) and all(day in f for day, f in zip(days, found))
