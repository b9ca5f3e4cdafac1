"""Mounts and swaps from procfs, keyed by device number so partitions and disks match exactly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from iotune.probes.sysfs import SysTree


@dataclass(frozen=True)
class Mount:
    devno: str  # "major:minor" as the kernel reports it
    source: str
    mountpoint: str
    fstype: str
    options: str
    mount_id: int = 0
    parent_id: int = 0
    super_options: str = ""


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
                mount_id=int(lf[0]) if lf[0].isdigit() else 0,
                parent_id=int(lf[1]) if lf[1].isdigit() else 0,
                super_options=rf[2] if len(rf) > 2 else "",
            )
        )
    return mounts


def _inside(path: str, mountpoint: str) -> bool:
    return path == mountpoint or path.startswith(mountpoint.rstrip("/") + "/")


def existing_ancestor(path: Path) -> Path:
    """*path*, or its nearest existing ancestor: the folder (and so the file system) a path
    that is yet to be made will be on."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def mount_of(mounts: list[Mount], path: str) -> Mount | None:
    """The mount *path* (absolute, resolved) lies on: the last-mounted of the longest
    mount points containing it (a later mount on the same point hides the earlier)."""
    best: Mount | None = None
    for m in mounts:
        if _inside(path, m.mountpoint) and (
            best is None or len(m.mountpoint) >= len(best.mountpoint)
        ):
            best = m
    return best


def _option_dirs(options: str, key: str) -> list[str]:
    """The directories of an overlay option (``lowerdir=a:b``; ``\\:`` escapes a colon)."""
    dirs: list[str] = []
    for opt in options.split(","):
        name, _, value = opt.partition("=")
        if name.rstrip("+") != key or not value:
            continue
        parts, cur, i = [], "", 0
        while i < len(value):
            if value.startswith("\\:", i):
                cur += ":"
                i += 2
                continue
            if value[i] == ":":
                parts.append(cur)
                cur = ""
            else:
                cur += value[i]
            i += 1
        parts.append(cur)
        dirs.extend(_unescape(d) for d in parts if d)
    return dirs


def overlay_layers(mounts: list[Mount], overlay: Mount) -> list[Mount] | None:
    """The mounts an overlay's layer directories (lowerdir, upperdir) lie on, resolved as
    when it was mounted: the overlay itself and whatever was mounted on top of it later
    (its descendants) are left out. None where a layer cannot be placed (a container whose
    layers lie outside its mount namespace, options this kernel hides)."""
    below = {overlay.mount_id}
    grew = True
    while grew:  # the overlay's descendants, by parent id
        grew = False
        for m in mounts:
            if m.parent_id in below and m.mount_id not in below:
                below.add(m.mount_id)
                grew = True
    dirs = _option_dirs(overlay.super_options, "lowerdir") + _option_dirs(
        overlay.super_options, "upperdir"
    )
    if not dirs or overlay.mount_id == 0:
        return None
    rest = [m for m in mounts if m.mount_id not in below]
    layers = []
    for d in dirs:
        under = mount_of(rest, d) if d.startswith("/") else None
        if under is None:
            return None
        layers.append(under)
    return layers


def read_swaps(tree: SysTree) -> list[str]:
    """Device paths in /proc/swaps (files used as swap live on a mounted filesystem)."""
    text = tree.read_raw("/proc/swaps") or ""
    return [line.split()[0] for line in text.splitlines()[1:] if line.strip()]
