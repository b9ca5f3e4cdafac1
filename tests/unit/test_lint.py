"""ruff and mypy are part of the test suite."""

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


def test_mypy_clean() -> None:
    p = subprocess.run(
        [str(BIN / "mypy"), "iotune"], cwd=TOP, capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, p.stdout + p.stderr
