"""Coverage-guided fuzzing of the network decoders with atheris (libFuzzer).

    python tests/fuzz/run_fuzz.py [--runs N] [--max-time S] [TARGET ...]

``make fuzz`` runs it (``FUZZ_RUNS``, ``FUZZ_TIME``, ``FUZZ_TARGETS``).
Targets run one after the other, each in a process of its own, so the
whole run uses one core. Each starts from its seed inputs plus the corpus
kept from earlier runs in ``build/fuzz/corpus/<target>`` and stops after
``--runs`` inputs or ``--max-time`` seconds, whichever comes first.

A finding stops its target: an exception other than the entry point's own
error type, an input taking more than ``--timeout`` seconds, or the process
growing past ``--rss-limit-mb``. libFuzzer writes the input to
``build/fuzz/artifacts/<target>/``; reproduce with
``python tests/fuzz/run_fuzz.py --reproduce FILE TARGET``.

The report (``build/fuzz/report.json``, and a table on standard output)
gives the inputs executed per target, from libFuzzer's final statistics.
Exit status 1 when any target had a finding.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORK_DIR = ROOT / "build" / "fuzz"
# libFuzzer's default input size cap is 4096 bytes; RLPx Hellos, request
# payloads and archives worth exploring fit in that.
MAX_INPUT_SIZE = 4096
DEFAULT_TIMEOUT_S = 10
DEFAULT_RSS_LIMIT_MB = 2048
_EXECUTED = re.compile(r"stat::number_of_executed_units:\s*(\d+)")
_DONE = re.compile(r"Done (\d+) runs in (\d+) second")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(HERE))
    if argv[:1] == ["--worker"]:
        return _worker(argv[1], argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="targets to run (default: all)")
    parser.add_argument("--runs", type=int, default=1_000_000, help="inputs per target (default 10^6)")
    parser.add_argument("--max-time", type=int, default=0, help="seconds per target, 0 for no bound")
    parser.add_argument("--timeout", type=int, default=DEFAULT_TIMEOUT_S, help="seconds one input may take")
    parser.add_argument("--rss-limit-mb", type=int, default=DEFAULT_RSS_LIMIT_MB)
    parser.add_argument("--report", type=Path, default=WORK_DIR / "report.json")
    parser.add_argument("--reproduce", type=Path, help="run one saved input through TARGET and show the error")
    args = parser.parse_args(argv)
    if args.reproduce:
        import fuzz_targets

        fuzz_targets.TARGETS[args.targets[0]](args.reproduce.read_bytes())
        print("no finding: the input is accepted or refused with the protocol's error")
        return 0
    import fuzz_targets

    names = args.targets or list(fuzz_targets.TARGETS)
    unknown = [n for n in names if n not in fuzz_targets.TARGETS]
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(fuzz_targets.TARGETS)}")
    results = [_run_target(name, args) for name in names]
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\n{'target':<16}{'inputs':>12}{'seconds':>9}{'per s':>9}  result")
    for r in results:
        rate = r["inputs"] / r["seconds"] if r["seconds"] else 0
        print(f"{r['target']:<16}{r['inputs']:>12,}{r['seconds']:>9.0f}{rate:>9,.0f}  {r['result']}")
    print(f"{'total':<16}{sum(r['inputs'] for r in results):>12,}")
    return 1 if any(r["result"] != "ok" for r in results) else 0


def _run_target(name: str, args) -> dict:
    corpus = WORK_DIR / "corpus" / name
    artifacts = WORK_DIR / "artifacts" / name
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        name,
        f"-runs={args.runs}",
        f"-max_total_time={args.max_time}",
        f"-timeout={args.timeout}",
        f"-rss_limit_mb={args.rss_limit_mb}",
        f"-max_len={MAX_INPUT_SIZE}",
        "-print_final_stats=1",
        f"-artifact_prefix={artifacts}/",
        str(corpus),
    ]
    print(f"fuzzing {name}: {' '.join(command[3:])}", flush=True)
    started = time.monotonic()
    log_path = WORK_DIR / f"{name}.log"
    with open(log_path, "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    seconds = time.monotonic() - started
    text = log_path.read_text(errors="replace")
    executed = _EXECUTED.findall(text)
    done = _DONE.findall(text)
    inputs = int(executed[-1]) if executed else int(done[-1][0]) if done else 0
    result = "ok" if code == 0 else f"finding (exit {code}, see {log_path} and {artifacts})"
    return {
        "target": name,
        "inputs": inputs,
        "seconds": round(seconds, 1),
        "result": result,
        "exit_code": code,
        "log": str(log_path),
    }


def _worker(name: str, libfuzzer_args: list[str]) -> int:
    """Fuzz one target in this process; ``libfuzzer_args`` end with the corpus directory."""
    import atheris

    with atheris.instrument_imports(include=["wakustore", "fuzz_targets"]):
        import fuzz_targets
    target = fuzz_targets.TARGETS[name]
    corpus = Path(libfuzzer_args[-1])
    for i, seed in enumerate(target.seeds()):
        (corpus / f"seed-{i:03d}").write_bytes(seed)
    atheris.Setup([sys.argv[0], *libfuzzer_args], target)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
