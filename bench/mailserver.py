"""``wakustore bench mailserver``: envelopes served per second through real RLPx.

What it measures:

1. Seeding: ``--envelopes`` deterministic envelopes (``--topics`` topics,
   sent over the last day, ``--payload-bytes`` of data each) go through
   :meth:`EnvelopeStore.put` and :meth:`EnvelopeStore.flush` in batches of
   the configured flush size, as the mailserver archives them.
2. Serving: a :class:`~wakustore.node.mailserver.Mailserver` on loopback
   and a :class:`~wakustore.clients.mailserver.MailserverClient` dialing
   it from another process (ECIES handshake, Hellos, snappy, waku/1
   status). Each of
   ``--requests`` requests asks for ``--page`` envelopes (1000, the
   maximum) after a random cursor, alternately by full bloom filter and
   by the explicit topic list; its latency runs from sending the P2P
   Request to receiving the Request Complete, every 0x7f bundle decoded.
3. The same queries straight on the store (no RLPx), to show what the
   engine takes of a request.

The JSON report (``--json``) holds ``envelopes``, ``page``,
``ingest_envelopes_per_s``, ``request_p50_ms``, ``request_p90_ms``,
``envelopes_per_s`` (page / p50), ``envelopes_per_s_overall`` (all
envelopes over all request time), ``mib_per_s``, ``per_shape`` and
``store_query_p50_ms``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

import trio

from wakustore.bench.common import add_common_arguments, positive_int, run_client_process
from wakustore.node import config as node_config
from wakustore.usage import UsageError

DEFAULT_ENVELOPES = 5000
DEFAULT_REQUESTS = 20
DEFAULT_TOPICS = 8
DEFAULT_PAYLOAD_BYTES = 256
WARMUP_REQUESTS = 3
# The client process: interpreter start and imports, then every request.
CLIENT_TIMEOUT_S = 600
SHAPES = ("bloom", "topics")
MIB = 1024 * 1024


def register_verb(verbs: argparse._SubParsersAction) -> None:
    verb = verbs.add_parser("mailserver", help="Waku v1 mailserver: envelopes/s served over RLPx")
    verb.add_argument(
        "--envelopes",
        type=positive_int,
        default=DEFAULT_ENVELOPES,
        help=f"envelopes seeded (default {DEFAULT_ENVELOPES}; at least twice --page)",
    )
    verb.add_argument(
        "--requests", type=positive_int, default=DEFAULT_REQUESTS, help=f"timed requests (default {DEFAULT_REQUESTS})"
    )
    verb.add_argument(
        "--page", type=positive_int, default=1000, help="envelopes per request (default 1000, the maximum)"
    )
    verb.add_argument("--topics", type=positive_int, default=DEFAULT_TOPICS)
    verb.add_argument("--payload-bytes", type=positive_int, default=DEFAULT_PAYLOAD_BYTES)
    add_common_arguments(verb, "where the table goes (must be empty; default: a temporary directory, removed)")
    verb.set_defaults(handler=run_mailserver_bench)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run_mailserver_bench(args: argparse.Namespace, engine=None) -> int:
    """Run the benchmark; on ``engine`` (started, left running) when given,
    else on a new engine as configured."""
    from wakustore.bench.store import percentile
    from wakustore.node.mailserver import open_envelope_store

    if args.page > 1000:
        raise UsageError("--page: the mailserver serves at most 1000 envelopes per request")
    if args.envelopes < 2 * args.page:
        raise UsageError("--envelopes must be at least twice --page (requests start at random cursors)")
    if args.data_dir is not None and args.data_dir.exists() and any(args.data_dir.iterdir()):
        raise UsageError(f"--data-dir {args.data_dir} is not empty (the benchmark creates a fresh table)")
    config = node_config.load(args.config, {"engine": args.engine, "data_dir": args.data_dir})
    temporary = None
    if args.data_dir is None:
        temporary = Path(tempfile.mkdtemp(prefix="wakustore-bench-mailserver-"))
        config.data_dir = temporary
    report: dict = {
        "envelopes": args.envelopes,
        "page": args.page,
        "requests": args.requests,
        "topics": args.topics,
        "payload_bytes": args.payload_bytes,
        "machine": {"cpus": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
    }
    try:
        owned = engine is None
        if owned:
            _say(f"mailserver bench: starting the engine ({config.engine}) under {config.data_dir}")
            engine = node_config.new_engine(config)
            engine.start()
        try:
            store = open_envelope_store(config, engine)
            try:
                rows = _seed(store, args, config.flush_max_messages, report)
                timings = trio.run(_serve_and_request, store, rows, args)
                store_ms = _store_queries(store, rows, args)
            finally:
                store.close()
        finally:
            if owned:
                engine.close()
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    latencies = [ms for ms, _, _ in timings["all"]]
    envelopes = sum(n for _, n, _ in timings["all"])
    total_bytes = sum(b for _, _, b in timings["all"])
    total_s = sum(latencies) / 1000
    p50 = percentile(latencies, 50)
    p90 = percentile(latencies, 90)
    store_p50 = percentile(store_ms, 50)
    # --requests is positive: at least one timed request and one timed store query.
    assert p50 is not None and p90 is not None and store_p50 is not None
    report.update(
        {
            "request_p50_ms": round(p50, 2),
            "request_p90_ms": round(p90, 2),
            "envelopes_per_s": round(args.page / (p50 / 1000), 1),
            "envelopes_per_s_overall": round(envelopes / total_s, 1),
            "mib_per_s": round(total_bytes / MIB / total_s, 2),
            # A shape with no timed request (--requests 1) is left out.
            "per_shape": {
                shape: {"n": len(v), "p50_ms": round(p, 2)}
                for shape, v in timings.items()
                if shape != "all" and (p := percentile([ms for ms, _, _ in v], 50)) is not None
            },
            "store_query_p50_ms": round(store_p50, 2),
        }
    )
    report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(
        f"\nmailserver benchmark: {args.envelopes:,} envelopes seeded, {args.requests} requests "
        f"of {args.page} over RLPx on loopback, {report['machine']['cpus']} CPUs"
    )
    print(f"  ingest                {report['ingest_envelopes_per_s']:>12,.0f} envelopes/s")
    print(f"  request p50 / p90     {report['request_p50_ms']:>9.1f} / {report['request_p90_ms']:.1f} ms")
    for shape, figures in report["per_shape"].items():
        print(f"    {shape:<19} {figures['p50_ms']:>9.1f} ms p50 ({figures['n']})")
    print(
        f"  served                {report['envelopes_per_s']:>12,.0f} envelopes/s at p50 "
        f"({report['envelopes_per_s_overall']:,.0f} overall, {report['mib_per_s']} MiB/s)"
    )
    print(f"  store query p50       {report['store_query_p50_ms']:>9.1f} ms (the same pages without RLPx)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _seed(store, args, batch_size: int, report: dict) -> list:
    """Put and flush the envelopes; returns their rows in (sent, hash) order."""
    from wakustore.protocols.waku_v1 import Envelope
    from wakustore.storage.envelope_store import StoredEnvelope

    rng = random.Random(args.seed)
    topics = [rng.randbytes(4) for _ in range(args.topics)]
    now = int(time.time())
    rows = []
    for i in range(args.envelopes):
        ttl = rng.choice((50, 120, 300))
        sent = now - 24 * 3600 + rng.randrange(24 * 3600 - 600)
        raw = Envelope(
            expiry=sent + ttl, ttl=ttl, topic=rng.choice(topics), data=rng.randbytes(args.payload_bytes), nonce=i
        ).encode()
        rows.append(StoredEnvelope.from_raw(raw, time.time_ns()))
    started = time.perf_counter()
    for start in range(0, len(rows), batch_size):
        store.put(rows[start : start + batch_size])
        store.flush()
    elapsed = time.perf_counter() - started
    report["ingest_envelopes_per_s"] = round(len(rows) / elapsed, 1)
    _say(f"mailserver bench: seeded {len(rows)} envelopes in {elapsed:.1f} s")
    rows.sort(key=lambda r: (r.sent, r.envelope_hash))
    report["topic_list"] = sorted(t.hex() for t in topics)
    return rows


def _requests(rows: list, args):
    """(shape, MessagesRequest) pairs: warm-up first, then the timed ones."""
    from wakustore.protocols import mailserver as wms
    from wakustore.protocols.waku_v1 import full_bloom

    rng = random.Random(args.seed + 1)
    lower, upper = rows[0].sent, rows[-1].sent
    topics = sorted({r.topic for r in rows})
    for i in range(WARMUP_REQUESTS + args.requests):
        shape = SHAPES[i % len(SHAPES)]
        before = rows[rng.randrange(len(rows) - args.page)]
        yield (
            shape,
            wms.MessagesRequest(
                lower=lower,
                upper=upper,
                bloom=full_bloom(),
                topics=topics if shape == "topics" else (),
                limit=args.page,
                cursor=wms.encode_cursor(before.sent, before.envelope_hash),
            ),
        )


async def _serve_and_request(store, rows: list, args) -> dict:
    """Serve from this process; request from a client in a process of its
    own, so that its decoding does not share the server's interpreter."""
    import coincurve

    from wakustore.node.mailserver import Mailserver, MailserverSettings

    settings = MailserverSettings(minimum_pow=0.0, rate_limit_s=0.0)
    server = Mailserver(store, coincurve.PrivateKey().secret, settings)
    requests = list(_requests(rows, args))
    async with trio.open_nursery() as nursery:
        info = await nursery.start(server.serve, "127.0.0.1", 0)
        samples = await trio.to_thread.run_sync(_run_client_process, info.enode, requests, settings.password)
        nursery.cancel_scope.cancel()
    timings: dict = {"all": [], **{shape: [] for shape in SHAPES}}
    for (shape, _), sample in list(zip(requests, samples))[WARMUP_REQUESTS:]:
        if sample[1] != args.page:
            raise RuntimeError(f"asked for {args.page} envelopes, got {sample[1]}")
        timings["all"].append(sample)
        timings[shape].append(sample)
    _say(f"mailserver bench: {args.requests} requests served")
    return timings


def _run_client_process(enode: str, requests: list, password: str) -> list[tuple[float, int, int]]:
    """Run the requests from a fresh interpreter (arguments and result pickled over its pipes)."""
    job = (enode, [request for _, request in requests], password)
    samples = run_client_process("wakustore.bench.mailserver", job, CLIENT_TIMEOUT_S)
    return cast(list[tuple[float, int, int]], samples)


def client_main() -> None:
    """The client process: reads (enode, requests, password) pickled on
    stdin, writes [(latency ms, envelopes, bytes)] pickled on stdout."""
    from wakustore.protocols.waku_v1 import key_from_password

    enode, requests, password = pickle.loads(sys.stdin.buffer.read())
    samples = trio.run(_client_requests, enode, requests, key_from_password(password))
    sys.stdout.buffer.write(pickle.dumps(samples))


async def _client_requests(enode: str, requests: list, key: bytes) -> list[tuple[float, int, int]]:
    from wakustore.clients.mailserver import MailserverClient

    samples = []
    async with MailserverClient.connect(enode) as client:
        for request in requests:
            started = time.perf_counter()
            answer = await client.request(request, key)
            ms = (time.perf_counter() - started) * 1000
            if answer.complete.error is not None:
                raise RuntimeError(f"the mailserver refused a request: {answer.complete.error}")
            samples.append((ms, len(answer.envelopes), sum(len(e) for e in answer.envelopes)))
    return samples


def _store_queries(store, rows: list, args) -> list[float]:
    from wakustore.protocols import mailserver as wms

    out = []
    for i, (_, request) in enumerate(_requests(rows, args)):
        cursor = wms.decode_cursor(request.cursor)
        started = time.perf_counter()
        store.query(
            request.lower,
            request.upper,
            topics=list(request.topics),
            bloom=None if request.topics else request.bloom,
            limit=request.limit,
            cursor=(cursor.timestamp, cursor.envelope_hash),
        )
        if i >= WARMUP_REQUESTS:
            out.append((time.perf_counter() - started) * 1000)
    return out
