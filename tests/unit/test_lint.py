"""ruff and mypy are part of the test suite."""

import os
import subprocess
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def test_ruff_clean() -> None:
    p = subprocess.run(
        [str(BIN / "ruff"), "check", "."], cwd=TOP, capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, p.stdout + p.stderr


#: what mypy checks, strictly: the package, its tests and the benchmarks (scripts that import
#: each other as benchmarks.X); tests/data holds recorded sysfs trees with symlink loops
MYPY_ARGS = [
    "--explicit-package-bases",
    "--exclude",
    "^tests/data/",
    "iotune",
    "tests",
    "benchmarks",
]


def test_mypy_clean() -> None:
    """mypy's incremental cache lives in the user's cache folder, not in the checkout: a
    fresh clone is checked again only where its files differ from the last check on this
    host (32 s cold here, under a second warm)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "iotune" / "mypy"
    p = subprocess.run(
        [str(BIN / "mypy"), "--cache-dir", str(cache), *MYPY_ARGS],
        cwd=TOP,
        capture_output=True,
        text=True,
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
