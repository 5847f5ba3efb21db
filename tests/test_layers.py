"""The layers of the package tree, checked on the source.

Every module of every package pyproject.toml maps is parsed with ``ast``;
every import counts, function-local ones and ``from x import y`` forms
included (``from wakustore.transport import torrent`` is an import of the
module ``wakustore.transport.torrent``). What is checked:

1. ``protocols/`` is sans-IO: no trio, Spark, Delta, Arrow, sockets or
   libp2p, and nothing of the project beyond ``protocols/``, ``protos/``
   and the compiled loops of ``wakustore._native`` (native/native.c:
   bytes in, bytes out, no I/O).
2. Spark, Delta Lake and Arrow are imported under ``storage/`` only.
3. Lower layers never import upper ones. From the bottom: ``protos/``,
   ``protocols/`` (sans-IO), then ``storage/`` (the engine and the table)
   and ``transport/`` (libp2p, devp2p, BitTorrent) side by side and
   ignorant of each other, then ``node/`` and ``clients/``, then ``cli/``
   and ``bench/``. ``clients/`` never imports ``node/``: an application
   embedding a client gets none of the server.
4. The module import graph has no cycle.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ENGINE_LIBRARIES = {"pyspark", "deltalake", "pyarrow"}
NOT_SANS_IO = {"trio", "socket", "libp2p"} | ENGINE_LIBRARIES
# The package itself (its __init__ holds the version) and the compiled
# module (native/native.c): computation only, for any layer.
# ``wakustore.usage`` holds UsageError, raised by every layer above the
# protocols for bad user input; ``wakustore.durable`` writes a file whole
# and durably, for every layer that keeps one; ``wakustore.allocator``
# tunes and trims the process's C heap (glibc), for whichever layer frees much.
SHARED = ("wakustore", "wakustore._native", "wakustore.usage", "wakustore.durable", "wakustore.allocator")
UPPER_LAYERS = ("wakustore.node", "wakustore.clients", "wakustore.cli", "wakustore.bench")
COMMANDS_AND_BENCHMARKS = ("wakustore.cli", "wakustore.bench")


def package_dirs(root: Path = ROOT) -> dict[str, Path]:
    """Package name -> folder, as pyproject.toml lists the packages and the
    one folder they are found under (``src/wakustore`` links to
    ``wakustore/``, whose subpackages link to the folders at the root);
    each folder is the one its link leads to."""
    with open(root / "pyproject.toml", "rb") as handle:
        setuptools = tomllib.load(handle)["tool"]["setuptools"]
    base = root / setuptools["package-dir"][""]
    return {package: (base / package.replace(".", "/")).resolve() for package in setuptools["packages"]}


def modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Module name -> source file, for every ``.py`` file of every package."""
    found = {}
    for package, folder in packages.items():
        for path in sorted(folder.glob("*.py")):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def imports(name: str, path: Path) -> set[str]:
    """Every module name ``path`` imports anywhere in its body; for
    ``from M import n`` both ``M`` and ``M.n`` (the caller keeps what exists)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.stem == "__init__"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")
                anchor = parts if is_package else parts[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(packages: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(project module -> project modules it imports, project module -> every
    top-level name it imports, the project's own ``wakustore`` included)."""
    found = modules(packages)
    graph, roots = {}, {}
    for name, path in found.items():
        names = imports(name, path)
        graph[name] = {n for n in names if n in found and n != name}
        roots[name] = {n.split(".")[0] for n in names if n}
    return graph, roots


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep graph cannot hit the recursion limit.
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _in(name: str, packages: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _project_imports(graph: dict[str, set[str]], layer: str) -> dict[str, set[str]]:
    return {m: targets for m, targets in graph.items() if _in(m, [layer])}


GRAPH, ROOTS = import_graph(package_dirs())


def test_the_graph_sees_every_package_and_function_local_imports():
    packages = {m.rsplit(".", 1)[0] if m.count(".") > 1 else m for m in GRAPH}
    for package in (
        "wakustore.protocols",
        "wakustore.storage",
        "wakustore.transport",
        "wakustore.node",
        "wakustore.clients",
        "wakustore.cli",
        "wakustore.bench",
        "wakustore.protos",
    ):
        assert package in packages
    # Imported inside functions only (cli/main.py's _extra_commands,
    # bench/store.py's SQL comparison).
    assert "wakustore.cli.serve" in GRAPH["wakustore.cli.main"]
    assert "wakustore.bench.sql" in GRAPH["wakustore.bench.store"]
    # `from wakustore.transport import torrent` names the module.
    assert "wakustore.transport.torrent" in GRAPH["wakustore.node.archive"]


def test_protocols_is_sans_io():
    problems = []
    for module, roots in ROOTS.items():
        if not _in(module, ["wakustore.protocols"]):
            continue
        problems += [f"{module} imports {r}" for r in sorted(roots & NOT_SANS_IO)]
        problems += [
            f"{module} imports {t}"
            for t in sorted(GRAPH[module])
            if not _in(t, ["wakustore.protocols", "wakustore.protos"]) and t not in SHARED
        ]
    assert not problems, problems


def test_spark_delta_and_arrow_only_under_storage():
    problems = [
        f"{module} imports {r}"
        for module, roots in ROOTS.items()
        for r in sorted(roots & ENGINE_LIBRARIES)
        if not _in(module, ["wakustore.storage"])
    ]
    assert not problems, problems


def test_lower_layers_never_import_upper_ones():
    rules = [
        ("wakustore.protocols", UPPER_LAYERS + ("wakustore.storage",)),
        ("wakustore.protos", UPPER_LAYERS + ("wakustore.storage", "wakustore.protocols")),
        ("wakustore.storage", UPPER_LAYERS + ("wakustore.transport",)),
        ("wakustore.transport", UPPER_LAYERS + ("wakustore.storage",)),
        ("wakustore.node", COMMANDS_AND_BENCHMARKS),
        ("wakustore.clients", COMMANDS_AND_BENCHMARKS + ("wakustore.node", "wakustore.storage")),
    ]
    problems = [
        f"{module} imports {target}"
        for layer, forbidden in rules
        for module, targets in _project_imports(GRAPH, layer).items()
        for target in sorted(targets)
        if _in(target, forbidden)
    ]
    assert not problems, problems


def test_no_import_cycle():
    assert cycles(GRAPH) == []


def test_the_checks_catch_a_cycle_through_a_function_local_import(tmp_path):
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "a.py").write_text("from . import b\n")
    (folder / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (folder / "c.py").write_text("import trio\n\ndef g():\n    from .a import x\n")
    (folder / "d.py").write_text("from pkg import c\n")
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackages = ["pkg"]\npackage-dir = {"" = "."}\n')
    graph, roots = import_graph(package_dirs(tmp_path))
    assert graph["pkg.a"] == {"pkg", "pkg.b"}  # `from . import b` runs pkg/__init__.py too
    assert graph["pkg.d"] == {"pkg", "pkg.c"}
    assert "trio" in roots["pkg.c"]
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
