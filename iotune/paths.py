"""Where iotune's non-Python files live: the source checkout, or the installed share/ tree."""

from __future__ import annotations

import sys
from pathlib import Path

_SOURCE_TOP = Path(__file__).resolve().parent.parent


def data_dir(name: str) -> Path:
    """``bpf``, ``configs`` or ``raid``: next to the package in a checkout, else in share/iotune."""
    for candidate in (_SOURCE_TOP / name, Path(sys.prefix) / "share" / "iotune" / name):
        if candidate.is_dir():
            return candidate
    return _SOURCE_TOP / name


def bpf_source(name: str) -> Path:
    return data_dir("bpf") / name
