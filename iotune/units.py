"""Sizes and rates as users type them, and as iotune prints them.

One grammar for every size and rate a user types (``--drive``'s keys, ``--network-link``,
``--chunk``, ``--block-size``, layouts): a number, then a unit whose case says what it counts,
as datasheets and network gear write it:

- ``B`` is bytes and ``b`` is bits (``GB/s`` is bytes a second, ``Gb/s``, ``Gbps``, ``Gbit/s`` and
  ``GbE`` are bits);
- SI prefixes are powers of ten (``k``/``K``, ``M``, ``G``, ``T``, ``P``: ``2TB`` is 2·10^12
  bytes), IEC prefixes powers of two (``Ki``, ``Mi``, ``Gi``, ``Ti``, ``Pi``: ``2MiB/s``);
- a rate ends in ``/s`` or ``ps`` (``GbE`` is a rate by itself);
- what could be read two ways is refused: ``gb`` (both letters small: bits or bytes?), a rate
  without a unit, a number without one where bytes and bits differ.

Block and buffer sizes (``--block-size 512K``, ``chunk = "512K"``) follow fio and DeepSpeed: a
bare prefix is binary (``512K`` = 512 KiB = 524288 bytes); ``512KB`` is refused there, since
a datasheet's KB is 1000 bytes and a block size's is 1024.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from iotune.errors import UsageError

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
#: binary gigabyte, the unit of memory and bandwidth figures labelled GiB
GIB = 1 << 30

_SI = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_IEC = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50, "E": 2**60}
_QUANTITY = re.compile(
    r"\s*(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*"
    r"(?P<prefix>[kKmMgGtTpPeE]?)(?P<iec>i?)"
    r"(?P<unit>bytes?|bits?|B|b|bE)?"
    r"(?P<per>/s|/sec|ps)?\s*"
)
#: what a bare prefix (``512K``, ``100G``) means where a quantity is typed without B or b
Bare = Literal["refuse", "binary", "bits"]


def parse_quantity(
    text: str, *, what: str, rate: bool, bare: Bare = "refuse", example: str | None = None
) -> float:
    """Bytes (or bytes/s with *rate*) of a figure a user typed, by the grammar above. *what*
    names the option in each refusal, *example* is the hint's. Raises UsageError in one line
    for anything that is not one figure, not positive, or ambiguous."""
    eg = example or ("7.0GB/s or 2MiB/s" if rate else "2TB or 1.5TiB")
    kind = "rate" if rate else "size"
    m = _QUANTITY.fullmatch(text)
    if m is None:
        raise UsageError(
            f"{named(what, text)} is not a {kind}", hint=f"write it with its unit, e.g. {eg}"
        )
    num = float(m.group("num"))
    prefix, iec, unit, per = m.group("prefix"), m.group("iec"), m.group("unit"), m.group("per")
    if not math.isfinite(num):
        raise UsageError(f"{named(what, text)} is not a finite figure", hint=f"e.g. {eg}")
    if num <= 0:
        raise UsageError(
            f"{what.rstrip('=')} must be positive, got {text.strip()!r}", hint=f"e.g. {eg}"
        )
    if iec and not prefix:
        raise UsageError(
            f"{named(what, text)} is not a {kind}: 'i' belongs to a prefix (KiB, MiB, GiB)",
            hint=f"e.g. {eg}",
        )
    if unit == "bE":  # Ethernet: 25GbE is a rate of bits by itself
        unit, per = "b", per or "/s"
    if rate and unit and per is None and not (bare == "bits" and unit in ("b", "bit", "bits")):
        # a link's "400 Gbit" is per second by trade; a drive's "7GB" is a size
        raise UsageError(f"{named(what, text)} is a size, not a rate", hint=f"add /s, e.g. {eg}")
    if not rate and per is not None:
        raise UsageError(f"{named(what, text)} is a rate, not a size", hint=f"e.g. {eg}")
    bits: bool
    if unit is None:
        if bare == "refuse" or (rate and bare == "binary"):
            raise UsageError(
                f"{named(what, text)} has no unit: bytes (B) or bits (b)?",
                hint=f"write it with its unit, e.g. {eg}",
            )
        if bare == "binary":
            if iec:
                raise UsageError(f"{named(what, text)} has no unit", hint=f"e.g. {eg}")
            return num * (_IEC[prefix.upper()] if prefix else 1)
        bits = True
    elif unit in ("B", "byte", "bytes"):
        bits = False
        if bare == "binary" and prefix and not iec:
            # a block size's KB: fio and DeepSpeed mean 1024, a datasheet 1000
            raise UsageError(
                f"{named(what, text)} is ambiguous: {prefix.upper()}B is 10^{_exp(prefix)} bytes "
                f"on a datasheet and 2^{10 * _pow(prefix)} in fio",
                hint=f"write {_strip(m.group('num'))}{prefix.upper()} or "
                f"{_strip(m.group('num'))}{prefix.upper()}iB (binary)",
            )
    else:  # b, bit, bits
        bits = True
        if unit == "b" and prefix in ("m", "g", "t", "p", "e"):  # k is SI's own small k
            raise UsageError(
                f"{named(what, text)} is ambiguous: bits or bytes?",
                hint=f"write {prefix.upper()}B for bytes or {prefix.upper()}b for bits, e.g. {eg}",
            )
    if prefix == "m" and not bits:
        raise UsageError(
            f"{named(what, text)} is ambiguous: a small m is milli",
            hint=f"write MB or MiB, e.g. {eg}",
        )
    scale = (_IEC if iec else _SI)[prefix.upper()] if prefix else 1
    value = num * scale
    return value / 8 if bits else value


def named(what: str, text: str) -> str:
    """``--drive read='7x'`` for a key, ``--chunk '7x'`` for an option."""
    return f"{what}{text!r}" if what.endswith("=") else f"{what} {text!r}"


def _exp(prefix: str) -> int:
    return 3 * _pow(prefix)


def _pow(prefix: str) -> int:
    return "KMGTPE".index(prefix.upper()) + 1


def _strip(num: str) -> str:
    return num.lstrip("+")


def parse_size(text: str, *, what: str = "size") -> int:
    """A block or buffer size: binary, whole bytes. 512K = 512KiB = 524288 bytes."""
    m = re.fullmatch(r"\s*[+-]?\d+\s*[kKmMgGtT]?(?:i?B)?\s*", text)
    if m is None:
        if re.fullmatch(r"\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)\s*[kKmMgGtT]?(?:i?B)?\s*", text):
            raise UsageError(
                f"{named(what, text)} is not a whole number of bytes or units",
                hint="e.g. 512K, 1M",
            )
        raise UsageError(
            f"{named(what, text)} is not a size",
            hint="write it as bytes or with K, M, G (binary): 512K, 1M",
        )
    value = parse_quantity(text, what=what, rate=False, bare="binary", example="512K")
    return int(value)


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
