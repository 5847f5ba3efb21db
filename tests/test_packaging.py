"""What an operator runs first: the install and `make run`."""

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
