"""A drive described by its datasheet (`iotune estimate --drive SPEC`): a key list such as
``read=7.0GB/s,write=5.1GB/s,link=16GT/s x4,capacity=2TB,tbw=1200TB``, or the name of a
profile in ``configs/drives.toml`` (optionally followed by keys that override it). Pure,
apart from reading that one file.

A datasheet's sequential figures are not what DeepSpeed's async I/O reaches: the planner
multiplies them by a derating factor (:class:`Derate`), measured where a sweep or a run of a
drive of that kind is given, else DeepSpeed's own published ratio (``[derate]`` in the
profile table). Units are the makers': MB/s, GB and TB are decimal; MiB/s, GiB and TiB binary.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from iotune.errors import UsageError
from iotune.paths import data_dir
from iotune.units import named, parse_quantity

_KEYS = (
    "read",
    "write",
    "link",
    "capacity",
    "tbw",
    "dwpd",
    "warranty_years",
    "cache",
    "after_cache",
    "dram",
)
#: nothing a single drive does today comes near these: a figure beyond them is a typo
MAX_RATE = 100e9  # B/s
MAX_CAPACITY = 1e15  # 1 PB
MAX_DWPD = 100.0
#: usable bytes/s per lane after line coding, by link speed in GT/s (PCIe 1.0 to 6.0)
_PER_LANE = {2.5: 0.25e9, 5.0: 0.5e9, 8.0: 0.985e9, 16.0: 1.969e9, 32.0: 3.938e9, 64.0: 7.877e9}
HINT = "--drive 'read=7.0GB/s,write=5.1GB/s,link=16GT/s x4,capacity=2TB,tbw=1200TB'"


@dataclass(frozen=True)
class DriveSpec:
    """One drive as its datasheet gives it; bytes, bytes/s and years."""

    label: str  # the profile's name, or "--drive" for a key list
    name: str
    read: float
    write: float
    link: str | None = None
    capacity: float | None = None
    tbw: float | None = None  # bytes the maker rates the drive to write
    dwpd: float | None = None
    warranty_years: float | None = None
    cache: float | None = None  # SLC cache, bytes
    after_cache: float | None = None  # sequential write once the cache is full, bytes/s
    dram: bool | None = None
    source: str = "--drive"
    cache_source: str | None = None

    @property
    def rated_writes(self) -> float | None:
        """Bytes the maker rates the drive to write: its TBW, else DWPD x capacity x the
        warranty's days."""
        if self.tbw is not None:
            return self.tbw
        if self.dwpd is not None and self.capacity and self.warranty_years:
            return self.dwpd * self.capacity * 365 * self.warranty_years
        return None

    def write_seconds(self, nbytes: float, rate: float) -> float:
        """Seconds to write *nbytes* at *rate* (bytes/s, derated), past the cache at the
        sustained rate where the datasheet gives both (a step's writes, each step anew)."""
        if self.cache is None or self.after_cache is None or nbytes <= self.cache:
            return nbytes / rate
        return self.cache / rate + (nbytes - self.cache) / min(rate, self.after_cache)

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "name": self.name,
            "read_bytes_s": self.read,
            "write_bytes_s": self.write,
            "link": self.link,
            "capacity_bytes": self.capacity,
            "tbw_bytes": self.tbw,
            "dwpd": self.dwpd,
            "warranty_years": self.warranty_years,
            "rated_writes_bytes": self.rated_writes,
            "cache_bytes": self.cache,
            "after_cache_bytes_s": self.after_cache,
            "dram": self.dram,
            "source": self.source,
            "cache_source": self.cache_source,
        }


@dataclass(frozen=True)
class Derate:
    """What DeepSpeed's async I/O reaches of a datasheet's sequential figures, per op."""

    read: float
    write: float
    source: str  # where the factors come from
    measured: bool = False


#: the lane counts PCIe defines (a drive has 1, 2 or 4; an add-in card up to 16)
LINK_WIDTHS = (1, 2, 4, 8, 12, 16, 32)
_LINK = re.compile(r"\s*([\d.]+)\s*GT/s\s*,?\s*x(\d+)\s*", re.I)


def link_bandwidth(link: str | None) -> float | None:
    """Bytes/s of a PCIe link as sysfs and ``iotune devices`` write it ("16.0 GT/s x4"),
    None where it is not reported (emulated controllers) or is no link PCIe defines."""
    if not link:
        return None
    m = _LINK.fullmatch(link) or re.search(r"([\d.]+)\s*GT/s.*?x(\d+)", link)
    if not m:
        return None
    per_lane = _PER_LANE.get(float(m.group(1)))
    width = int(m.group(2))
    return per_lane * width if per_lane and width in LINK_WIDTHS else None


def parse_link(text: str, what: str = "--drive link=") -> str:
    """A PCIe link a user typed (``16GT/s x4``), checked against the speeds and widths PCIe
    defines: returned as typed."""
    m = _LINK.fullmatch(text)
    if m is None or link_bandwidth(text) is None:
        speeds = ", ".join(f"{v:g}" for v in _PER_LANE)
        raise UsageError(
            f"{named(what, text)} is not a PCIe link",
            hint=f"link=16GT/s x4 (speeds {speeds} GT/s; widths "
            f"x{', x'.join(map(str, LINK_WIDTHS))})",
        )
    return text.strip()


def _quantity(text: str, key: str, *, per_second: bool) -> float:
    """``7.0GB/s``, ``7000 MB/s``, ``2MiB/s``, ``56Gb/s``; ``2TB``, ``341 GB``, ``1.5TiB``."""
    return parse_quantity(
        text,
        what=f"--drive {key}=",
        rate=per_second,
        example=f"{key}=7.0GB/s" if per_second else f"{key}=2TB",
    )


def _number(text: str, key: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"--drive {key}={text!r} is not a number", hint=f"e.g. {key}=1") from None


def _set(fields: dict[str, Any], key: str, value: Any) -> None:
    """One key of a spec or profile into DriveSpec's fields (validated, in bytes)."""
    text = str(value).strip()
    if key in ("read", "write", "after_cache"):
        fields[key] = _quantity(text, key, per_second=True)
    elif key in ("capacity", "tbw", "cache"):
        fields[key] = _quantity(text, key, per_second=False)
    elif key in ("dwpd", "warranty_years"):
        fields[key] = _number(text, key)
    elif key == "link":
        fields[key] = parse_link(text)
    elif key == "dram":
        if text.lower() not in ("true", "false", "yes", "no"):
            raise UsageError(f"--drive dram={text!r} is not true or false", hint="dram=false")
        fields[key] = text.lower() in ("true", "yes")
    else:
        raise UsageError(
            f"--drive has no key {key!r}", hint=f"the keys: {', '.join(_KEYS)}; e.g. {HINT}"
        )


def _check(spec: DriveSpec) -> DriveSpec:
    """Refuse figures no drive has: each one line with the key that is wrong."""
    for key in ("read", "write", "after_cache"):
        v = getattr(spec, key)
        if v is not None and not 0 < v <= MAX_RATE:
            raise UsageError(
                f"--drive {key}: {v / 1e9:g} GB/s is not a drive's rate",
                hint="a positive figure up to 100 GB/s, e.g. read=7.0GB/s",
            )
    for key in ("capacity", "cache", "tbw"):
        v = getattr(spec, key)
        top = MAX_CAPACITY * (10_000 if key == "tbw" else 1)
        if v is not None and not 0 < v <= top:
            raise UsageError(
                f"--drive {key}: {v / 1e12:g} TB is not a drive's figure",
                hint="a positive size with its unit, e.g. capacity=2TB, tbw=1200TB",
            )
    if spec.dwpd is not None and not 0 < spec.dwpd <= MAX_DWPD:
        raise UsageError(f"--drive dwpd={spec.dwpd:g} is not a rating", hint="e.g. dwpd=1")
    if spec.warranty_years is not None and not 0 < spec.warranty_years <= 20:
        raise UsageError(
            f"--drive warranty_years={spec.warranty_years:g} is not a warranty", hint="e.g. 5"
        )
    if spec.dwpd is not None and spec.capacity is None:
        # a TBW alone gives the days until it is used up; DWPD is a fraction of the capacity
        raise UsageError(
            "--drive gives drive writes per day (dwpd) without the drive's capacity: DWPD is "
            "a fraction of it",
            hint="add capacity, e.g. capacity=2TB, or give tbw= instead",
        )
    if (spec.cache is None) != (spec.after_cache is None):
        given, other = (
            ("cache", "after_cache") if spec.cache is not None else ("after_cache", "cache")
        )
        raise UsageError(
            f"--drive {given}= needs {other}=: the SLC cache's size and the write rate once it "
            "is full go together",
            hint="e.g. cache=341GB,after_cache=450MB/s",
        )
    if spec.cache is not None and spec.capacity is not None and spec.cache > spec.capacity:
        raise UsageError("--drive cache is larger than the drive", hint="e.g. cache=216GB")
    return spec


def load_profiles(path: Path | None = None) -> tuple[dict[str, DriveSpec], Derate]:
    """The profile table and DeepSpeed's published derating."""
    p = path or data_dir("configs") / "drives.toml"
    try:
        with p.open("rb") as fh:
            doc = tomllib.load(fh)
        derate = Derate(
            float(doc["derate"]["read"]),
            float(doc["derate"]["write"]),
            f"read: {doc['derate']['read_source']}; write: {doc['derate']['write_source']}",
        )
        profiles = {}
        for label, row in doc["drive"].items():
            fields: dict[str, Any] = {}
            for key in _KEYS:
                if key in row:
                    _set(fields, key, row[key])
            profiles[label] = _check(
                DriveSpec(
                    label=label,
                    name=str(row["name"]),
                    source=str(row["source"]),
                    cache_source=row.get("cache_source"),
                    **fields,
                )
            )
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise UsageError(
            f"cannot read the drive profiles in {p}: {exc}", hint="reinstall iotune"
        ) from exc
    return profiles, derate


def parse_drive(text: str, path: Path | None = None) -> DriveSpec:
    """``--drive``: a profile's name, a key list, or a profile's name then keys that
    override it (``samsung-980-pro-2tb,capacity=1TB``)."""
    profiles, _ = load_profiles(path)
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts:
        raise UsageError("--drive is empty", hint=HINT)
    base: DriveSpec | None = None
    if "=" not in parts[0]:
        name = parts.pop(0)
        base = profiles.get(name)
        if base is None:
            raise UsageError(
                f"--drive {name!r} is no drive profile",
                hint=f"a profile ({', '.join(sorted(profiles))}) or keys: {HINT}",
            )
    fields: dict[str, Any] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or not value.strip():
            raise UsageError(f"--drive {part!r} is not KEY=VALUE", hint=HINT)
        key = key.strip().lower()
        if key in fields:
            raise UsageError(f"--drive gives {key}= twice", hint="give each key once")
        _set(fields, key, value)
    if base is not None:
        return _check(_override(base, fields))
    missing = [k for k in ("read", "write") if k not in fields]
    if missing:
        raise UsageError(f"--drive needs a sequential {' and '.join(missing)} rate", hint=HINT)
    return _check(DriveSpec(label="--drive", name="the drive of --drive", **fields))


def _override(base: DriveSpec, fields: dict[str, Any]) -> DriveSpec:
    """A profile with a user's keys. Another capacity of the same drive keeps the profile's
    endurance per byte (its DWPD: makers rate a family's TBW in proportion to capacity, as
    the 980 PRO's 600 TBW at 1 TB and 1,200 at 2 TB), and keeps its cache only if it fits;
    the source says what was scaled."""
    if not fields:
        return base
    notes = ["with --drive's keys"]
    cap = fields.get("capacity")
    if cap is not None and base.capacity and cap != base.capacity:
        ratio = cap / base.capacity
        if base.tbw is not None and "tbw" not in fields and "dwpd" not in fields:
            fields["tbw"] = base.tbw * ratio
            notes.append(
                f"tbw {fields['tbw'] / 1e12:,.0f} TB scaled from the profile's "
                f"{base.tbw / 1e12:,.0f} TB at {base.capacity / 1e12:g} TB by capacity"
            )
        elif "dwpd" in fields and "tbw" not in fields:
            fields["tbw"] = None  # the user's DWPD, not the profile's TBW, rates it
    elif "dwpd" in fields and "tbw" not in fields:
        fields["tbw"] = None
    return replace(base, **fields, source=f"{base.source} ({'; '.join(notes)})")
