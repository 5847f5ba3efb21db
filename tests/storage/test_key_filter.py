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
