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
    # -n: print the commands without running them (the install step, if
    # due, is printed too; serve is the last command)
    result = subprocess.run(
        # --no-print-directory: under `make test` this make is a sub-make,
        # which would print "Entering/Leaving directory" lines.
        ["make", "--no-print-directory", "-n", "run", "ARGS=--tcp-port 0 --shard 1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last == ".venv/bin/wakustore serve --data-dir ./data --tcp-port 0 --shard 1"
