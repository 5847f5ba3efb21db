"""protocols/ stays sans-IO: no trio, Spark, sockets or file system."""

import ast
import pathlib
import subprocess
import sys

import wakustore.protocols

PACKAGE = pathlib.Path(wakustore.protocols.__file__).parent
FORBIDDEN_MODULES = {
    "trio",
    "pyspark",
    "pysail",
    "deltalake",
    "socket",
    "asyncio",
    "selectors",
    "os",
    "io",
    "pathlib",
    "shutil",
    "tempfile",
    "subprocess",
    "libtorrent",
    "libp2p",
}
FORBIDDEN_CALLS = {"open"}


def _sources():
    files = sorted(PACKAGE.glob("*.py"))
    assert files, "protocols/ has no modules"
    return files


def test_protocols_import_no_io_modules():
    offenders = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in FORBIDDEN_MODULES:
                    offenders.append(f"{path.name}: import {name}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
                offenders.append(f"{path.name}:{node.lineno}: {node.func.id}()")
    assert offenders == []


def test_importing_protocols_loads_no_engine_or_network_stack():
    modules = [f"wakustore.protocols.{p.stem}" for p in _sources() if p.stem != "__init__"]
    code = (
        "import sys, importlib\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(','.join(sorted(n for n in ('trio','pyspark','pysail','deltalake','libtorrent','libp2p') if n in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
