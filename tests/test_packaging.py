"""What an operator runs first: the install and `make run`."""

import os
import pathlib
import subprocess
import warnings

from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution
from setuptools.warnings import SetuptoolsDeprecationWarning

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_pyproject_applies_without_deprecation_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    deprecations = [str(w.message) for w in caught if issubclass(w.category, SetuptoolsDeprecationWarning)]
    assert deprecations == []
    assert dist.metadata.license_expression == "MIT OR Apache-2.0"


def test_make_run_passes_args_to_serve():
    # serve --help: the recipe runs for real (words of ARGS, no shell) and
    # returns at once; its first line is the command it runs.
    result = subprocess.run(
        # --no-print-directory: under `make test` this make is a sub-make,
        # which would print "Entering/Leaving directory" lines.
        ["make", "--no-print-directory", "-s", "run", "ARGS=--tcp-port 0 --shard 1 --help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    command = next(line for line in lines if "wakustore serve" in line)
    assert command == ".venv/bin/wakustore serve --data-dir ./data --tcp-port 0 --shard 1 --help"
    assert any(line.startswith("usage: wakustore serve") for line in lines)


# What an editable install needs of the repository: the packaging files, the
# compiled module's source, and the folders of the packages with their links.
_INSTALL_FILES = ("pyproject.toml", "setup.py", "README.md")
_INSTALL_FOLDERS = (
    "native",
    "src",
    "wakustore",
    "protos",
    "protocols",
    "storage",
    "transport",
    "node",
    "clients",
    "cli",
    "bench",
)

_BUILD_EDITABLE = r"""
import json, warnings, zipfile
from setuptools import build_meta
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    name = build_meta.build_editable("dist")
with zipfile.ZipFile("dist/" + name) as wheel:
    files = {n: wheel.read(n).decode() for n in wheel.namelist() if not n.endswith("/")}
print(json.dumps({"warnings": [f"{w.category.__name__}: {w.message}" for w in caught], "files": files}))
"""


def test_editable_install_puts_one_folder_on_the_path_without_warnings(tmp_path):
    """`pip install -e .` (make install) maps the packages by a plain .pth
    line, src/, where src/wakustore holds every package (links): no import
    hook, and none of setuptools' warnings about it (a folder named like the
    package, wakustore/, shadowing the install). Built from a copy of the
    repository, so that the compiled module lands in the copy."""
    import json
    import shutil
    import sys

    copy = tmp_path / "repo"
    copy.mkdir()
    for name in _INSTALL_FILES:
        shutil.copy2(ROOT / name, copy / name)
    for name in _INSTALL_FOLDERS:
        shutil.copytree(ROOT / name, copy / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    built = subprocess.run(
        [sys.executable, "-c", _BUILD_EDITABLE], cwd=copy, capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stderr
    answer = json.loads(built.stdout.strip().splitlines()[-1])
    assert answer["warnings"] == []
    pth = {name: text for name, text in answer["files"].items() if name.endswith(".pth")}
    assert list(pth.values()) == [f"{copy / 'src'}\n"]
    assert [name for name in answer["files"] if name.endswith(".py")] == []  # no import hook module

    # From that path entry, every package, the compiled module and the
    # packaged .proto files are the copy's.
    probe = (
        "import importlib, importlib.resources, json\n"
        "names = ['wakustore', 'wakustore._native', 'wakustore.protos', 'wakustore.protocols', 'wakustore.storage',\n"
        "         'wakustore.transport', 'wakustore.node', 'wakustore.clients', 'wakustore.cli', 'wakustore.bench',\n"
        "         'wakustore.cli.main', 'wakustore.node.config']\n"
        "files = {n: importlib.import_module(n).__file__ for n in names}\n"
        "files['proto'] = str(importlib.resources.files('wakustore.protos') / 'store_v3.proto')\n"
        "print(json.dumps(files))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(copy / "src")}
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=True
    )
    for name, path in json.loads(found.stdout).items():
        assert path.startswith(str(copy / "src" / "wakustore")), (name, path)
        assert pathlib.Path(path).is_file(), (name, path)
