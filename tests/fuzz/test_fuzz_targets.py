"""A small budget of the fuzz targets (tests/fuzz/fuzz_targets.py) on every test run.

Each target gets its seed inputs, then random byte-level mutations of them
and random bytes, for about a second; only the entry point's own error type
may escape. ``make fuzz`` runs the same targets coverage-guided at scale.
The findings those runs made are kept below as regression inputs.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_targets  # noqa: E402

from wakustore.protocols import archive  # noqa: E402
from wakustore.protocols.errors import ArchiveError  # noqa: E402

BUDGET_S = 1.0
SEED = 20240601


@pytest.mark.parametrize("name", sorted(fuzz_targets.TARGETS))
def test_target_raises_only_its_protocol_error(name):
    target = fuzz_targets.TARGETS[name]
    seeds = target.seeds()
    assert seeds, "a target needs seed inputs"
    for seed in seeds:
        target(seed)
    rng = random.Random(f"{SEED}-{name}")
    runs = 0
    deadline = time.monotonic() + BUDGET_S
    while time.monotonic() < deadline:
        for data in (
            fuzz_targets.mutate(rng.choice(seeds), rng),
            bytes([rng.randrange(256)]) + rng.randbytes(rng.randrange(96)),
        ):
            try:
                target(data)
            except Exception as exc:  # the input, to reproduce with run_fuzz.py --reproduce
                raise AssertionError(f"{name}: {type(exc).__name__}: {exc}; input {data.hex()}") from exc
            runs += 1
    assert runs > 0


def test_every_seed_reaches_a_decoder():
    # Seeds must select each entry point of their target, or the fuzzer
    # starts some of them from nothing.
    for target in fuzz_targets.TARGETS.values():
        chosen = {seed[0] % len(target.entries) for seed in target.seeds()}
        assert chosen == set(range(len(target.entries))), target.name


# --- regressions found by make fuzz ---------------------------------------------------------


def _archived_with_pubsub_topic(raw_topic: bytes, layout: archive.Layout) -> bytes:
    from wakustore.protocols.archive_records import EXT_ARRIVAL, EXT_PUBSUB_TOPIC
    from wakustore.protocols.message import WakuMessage

    message = WakuMessage(b"p", fuzz_targets.CONTENT_TOPIC, 1, fuzz_targets.NOW_NS)
    record = archive.encode_archived_message(layout, fuzz_targets.PUBSUB_TOPIC, message, fuzz_targets.NOW_NS).data
    fields = [(n, w, v) for n, w, v in archive.proto_fields(record) if n not in (EXT_PUBSUB_TOPIC, EXT_ARRIVAL)]
    out = b""
    for number, wire, value in fields:
        out += archive.field_varint(number, value) if wire == 0 else archive.field_bytes(number, value)
    return out + archive.field_bytes(EXT_PUBSUB_TOPIC, raw_topic) + archive.field_varint(EXT_ARRIVAL, 1)


@pytest.mark.parametrize("layout", list(archive.Layout))
def test_archived_message_with_a_non_utf8_pubsub_topic_is_an_archive_error(layout):
    raw = _archived_with_pubsub_topic(b"/waku/\x80\xff", layout)
    with pytest.raises(ArchiveError, match="pubsub topic is not UTF-8"):
        archive.decode_archived_message(layout, raw, fuzz_targets.PUBSUB_TOPIC)


def test_a_status_go_record_whose_seconds_overflow_nanoseconds_is_an_archive_error():
    # found by make fuzz: a record without the extra fields (as status-go
    # writes them) whose seconds are past int64 nanoseconds
    record = archive.field_varint(2, 2**63 // 10**9 + 1) + archive.field_bytes(3, b"\x01\x02\x03\x04")
    with pytest.raises(ArchiveError, match="does not fit"):
        archive.decode_archived_message(archive.Layout.STATUS_GO, record, fuzz_targets.PUBSUB_TOPIC)
