"""Mounts and swaps from procfs, keyed by device number so partitions and disks match exactly."""

from __future__ import annotations

from dataclasses import dataclass

from iotune.probes.sysfs import SysTree


@dataclass(frozen=True)
class Mount:
    devno: str  # "major:minor" as the kernel reports it
    source: str
    mountpoint: str
    fstype: str
    options: str


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) + 1 and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def read_mounts(tree: SysTree) -> list[Mount]:
    """Parse /proc/self/mountinfo (proc(5): fields before ' - ' then fstype, source, options)."""
    text = tree.read_raw("/proc/self/mountinfo") or ""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 6 or len(rf) < 2:
            continue
        mounts.append(
            Mount(
                devno=lf[2],
                source=_unescape(rf[1]),
                mountpoint=_unescape(lf[4]),
                fstype=rf[0],
                options=lf[5],
            )
        )
    return mounts


def read_swaps(tree: SysTree) -> list[str]:
    """Device paths in /proc/swaps (files used as swap live on a mounted filesystem)."""
    text = tree.read_raw("/proc/swaps") or ""
    return [line.split()[0] for line in text.splitlines()[1:] if line.strip()]
