"""Regenerate the protobuf modules of ``wakustore.protos`` from its ``.proto`` files.

Every ``*.proto`` in this directory is compiled with the protoc bundled in
grpcio-tools (pinned in pyproject's ``test`` extra) into ``<name>_pb2.py`` and
``<name>_pb2.pyi`` next to it.

The directory is mounted on protoc's import path under the virtual prefix
``wakustore/protos``: the .proto files import each other as
``import "wakustore/protos/waku_message.proto";``, so the generated modules
import each other as ``from wakustore.protos import waku_message_pb2`` with no
rewriting, and the files are registered in the protobuf descriptor pool under
names no other package uses.

Usage::

    python -m wakustore.protos.generate            # rewrite the generated modules
    python -m wakustore.protos.generate --check    # exit 1 if they are out of date
    python protos/generate.py [--check]

``--check`` compiles into a temporary directory and compares byte for byte
with the modules present here; it lists missing, extra and changed files and
exits 1, or exits 0 when everything matches. Output depends only on the
.proto sources and the protoc version, so two runs give identical bytes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from importlib import resources
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
# Virtual directory the sources are mounted at; it is also the Python package
# path of the generated modules.
IMPORT_PREFIX = "wakustore/protos"
GENERATED_PATTERNS = ("*_pb2.py", "*_pb2.pyi")


def proto_sources(proto_dir: Path) -> list[Path]:
    """The .proto files to compile, in a stable order."""
    return sorted(proto_dir.glob("*.proto"))


def generated_files(directory: Path) -> dict[str, Path]:
    """Generated modules present in ``directory``, by file name."""
    found: dict[str, Path] = {}
    for pattern in GENERATED_PATTERNS:
        for path in directory.glob(pattern):
            found[path.name] = path
    return found


def compile_protos(proto_dir: Path, out_dir: Path) -> dict[str, bytes]:
    """Run protoc over every source in ``proto_dir``; return {file name: bytes}."""
    from grpc_tools import protoc  # imported here so --help works without it

    sources = proto_sources(proto_dir)
    if not sources:
        raise SystemExit(f"no .proto files in {proto_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={IMPORT_PREFIX}={proto_dir}",
        f"--proto_path={well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *(f"{IMPORT_PREFIX}/{source.name}" for source in sources),
    ]
    status = protoc.main(args)
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")
    package_dir = out_dir / IMPORT_PREFIX
    return {name: path.read_bytes() for name, path in sorted(generated_files(package_dir).items())}


def diff(proto_dir: Path, fresh: dict[str, bytes]) -> list[str]:
    """Lines describing how the modules in ``proto_dir`` differ from ``fresh``."""
    present = generated_files(proto_dir)
    problems: list[str] = []
    for name in sorted(set(fresh) | set(present)):
        if name not in present:
            problems.append(f"missing: {name}")
        elif name not in fresh:
            problems.append(f"extra: {name} (no .proto produces it)")
        elif present[name].read_bytes() != fresh[name]:
            problems.append(f"changed: {name}")
    return problems


def check(proto_dir: Path = PROTO_DIR) -> list[str]:
    """Compile into a temporary directory and compare; empty list when up to date."""
    with tempfile.TemporaryDirectory(prefix="wakustore-protos-") as tmp:
        return diff(proto_dir, compile_protos(proto_dir, Path(tmp)))


def write(proto_dir: Path = PROTO_DIR) -> list[str]:
    """Bring the generated modules in ``proto_dir`` up to date; return what changed."""
    with tempfile.TemporaryDirectory(prefix="wakustore-protos-") as tmp:
        fresh = compile_protos(proto_dir, Path(tmp))
    changes = diff(proto_dir, fresh)
    for name, data in fresh.items():
        target = proto_dir / name
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
    for name, path in generated_files(proto_dir).items():
        if name not in fresh:
            path.unlink()
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wakustore.protos.generate",
        description="Regenerate the *_pb2 modules from the .proto files.",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not write; exit 1 listing the modules that differ from a fresh build",
    )
    parser.add_argument(
        "--proto-dir",
        type=Path,
        default=PROTO_DIR,
        help="directory holding the .proto files and generated modules (default: this one)",
    )
    options = parser.parse_args(argv)
    proto_dir = options.proto_dir.resolve()

    if options.check:
        problems = check(proto_dir)
        if problems:
            print("generated protobuf modules are out of date:", file=sys.stderr)
            for line in problems:
                print(f"  {line}", file=sys.stderr)
            print("run: python -m wakustore.protos.generate", file=sys.stderr)
            return 1
        print("generated protobuf modules are up to date")
        return 0

    changes = write(proto_dir)
    for line in changes:
        print(line)
    print(f"{len(changes)} generated file(s) updated" if changes else "nothing to update")
    return 0


if __name__ == "__main__":
    sys.exit(main())
