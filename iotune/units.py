"""Sizes as users type them (512K, 1M, 4KiB, 524288) and as iotune prints them."""

from __future__ import annotations

import re

from iotune.errors import UsageError

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
#: binary gigabyte, the unit of memory and bandwidth figures labelled GiB
GIB = 1 << 30


def parse_size(text: str, *, what: str = "size") -> int:
    """Binary units: 512K = 512 KiB = 524288 bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not m:
        raise UsageError(
            f"{what} {text!r} is not a size",
            hint="write it as bytes or with K, M, G (binary): 512K, 1M",
        )
    value = int(m.group(1)) * _UNITS[m.group(2)]
    if value <= 0:
        raise UsageError(f"{what} must be positive, got {text!r}", hint="e.g. 512K")
    return value


def format_size(n: int) -> str:
    """Exact binary form: 524288 → '512K', 1536 → '1536', 1048576 → '1M'."""
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def binary_size(n: int) -> str:
    """A size with its binary unit spelled out, as tables label columns: 512 KiB, 1 MiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def scale_for(peak: float) -> tuple[str, float]:
    """The binary unit that shows amounts up to *peak* bytes (or bytes/s) with useful digits:
    GiB from 1 GiB, else MiB from 1 MiB, else KiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if peak >= scale:
            return unit, float(scale)
    return "KiB", 1024.0


def amount(n: float, per: str = "") -> str:
    """Bytes (or bytes/s with per='/s') in the unit that fits them: 1.50 GiB, 25.0 MiB/s."""
    unit, scale = scale_for(n)
    return f"{n / scale:.2f} {unit}{per}" if unit == "GiB" else f"{n / scale:.1f} {unit}{per}"


def gib_text(n: float | None, digits: int = 1) -> str:
    """Bytes as GiB with *digits* decimals, for a table cell; "-" for none."""
    return "-" if n is None else f"{n / GIB:.{digits}f}"


def gib_value(n: float | None) -> float | None:
    """Bytes as GiB rounded for a record (4 decimals); None for none."""
    return None if n is None else round(n / GIB, 4)
