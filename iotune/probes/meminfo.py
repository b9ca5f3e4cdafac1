"""Host memory from /proc/meminfo, in bytes."""

from __future__ import annotations

from iotune.probes.sysfs import SysTree


def meminfo(tree: SysTree) -> dict[str, int]:
    """Every /proc/meminfo field that holds a number, in bytes where the kernel says kB."""
    out = {}
    for line in (tree.read_raw("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def mem_available(tree: SysTree | None = None) -> int:
    """MemAvailable in bytes (0 when the kernel does not report it); the live host by default."""
    return meminfo(tree or SysTree("/")).get("MemAvailable", 0)
