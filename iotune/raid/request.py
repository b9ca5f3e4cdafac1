"""What `iotune raid create` is asked to build: a layout file (``raid/*.toml``) checked against
its keys, merged with the command-line flags into a :class:`RaidRequest`.

A flag typed on the command line wins over the layout; the layout wins over a flag's default.
``--persist`` and ``--wipe`` switch on what the layout leaves off, and naming drives replaces
the layout's drives (and its ``all_unused``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from iotune.errors import UsageError
from iotune.raid.model import Fs, RaidRequest
from iotune.units import parse_size

LAYOUT_KEYS = frozenset(
    {"name", "level", "chunk", "fs", "mount", "persist", "all_unused", "devices", "wipe"}
)


def load_layout(path: str) -> dict[str, Any]:
    """A layout file's table; unknown keys are refused (a typo would silently do nothing)."""
    import tomllib

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError as exc:
        raise UsageError(f"layout {path} does not exist", hint="see raid/*.toml") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"layout {path} is not valid TOML: {exc}", hint="see raid/*.toml") from exc
    unknown = sorted(set(data) - LAYOUT_KEYS)
    if unknown:
        raise UsageError(
            f"layout {path}: unknown key(s) {', '.join(unknown)}",
            hint=f"keys: {', '.join(sorted(LAYOUT_KEYS))}",
        )
    return data


@dataclass(frozen=True)
class CreateFlags:
    """The create command's flags, by layout key; *given* names those typed on the command
    line (as opposed to left at their defaults)."""

    devices: tuple[str, ...]
    all_unused: bool
    level: int
    chunk: str
    name: str
    fs: str
    mount: str | None
    persist: bool
    wipe: bool
    mkfs_options: tuple[str, ...]
    given: frozenset[str]


def merge(layout: Mapping[str, Any], flags: CreateFlags) -> dict[str, Any]:
    """The layout's table with the flags applied (see the module docstring for who wins)."""
    spec = dict(layout)
    for key in ("level", "chunk", "name", "fs", "mount"):
        if key in flags.given or key not in spec:
            spec[key] = getattr(flags, key)
    spec["persist"] = flags.persist or bool(spec.get("persist", False))
    spec["wipe"] = flags.wipe or bool(spec.get("wipe", False))
    if flags.devices:
        spec["devices"], spec["all_unused"] = list(flags.devices), False
    elif flags.all_unused:
        spec["all_unused"] = True
    return spec


def request_from(layout: Mapping[str, Any], flags: CreateFlags) -> RaidRequest:
    """The request the layout and the flags make; a bad value or no drives is a usage error."""
    spec = merge(layout, flags)
    try:
        req = RaidRequest(
            name=str(spec["name"]),
            level=int(spec["level"]),
            chunk=parse_size(str(spec["chunk"]), what="chunk"),
            devices=tuple(str(d) for d in spec.get("devices", [])),
            all_unused=bool(spec.get("all_unused", False)),
            fs=Fs(str(spec["fs"])),
            mount=str(spec["mount"]) if spec.get("mount") else None,
            persist=bool(spec["persist"]),
            wipe=bool(spec["wipe"]),
            mkfs_options=flags.mkfs_options,
        )
    except ValueError as exc:
        raise UsageError(f"bad layout value: {exc}", hint="see raid/*.toml") from exc
    if not req.devices and not req.all_unused:
        raise UsageError(
            "name the drives, or --all-unused", hint="iotune raid create nvme0n1 nvme1n1 nvme2n1"
        )
    return req
