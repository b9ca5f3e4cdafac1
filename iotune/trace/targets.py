"""Which drives to trace: named devices, or the drives behind a path.

A path resolves file → filesystem → partition → disk, or → md array → its member drives
(md RAID is bio-based: its requests are issued on the members, so the array's figures are
the sum over its members). dm devices (LVM, crypt) are followed to their slaves likewise, and
an NVMe multipath head (a namespace over fabrics) to its paths.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from iotune.errors import DeviceNotFound, UsageError
from iotune.probes.fabrics import mpath_paths
from iotune.probes.sysfs import SysTree, disk_of


@dataclass(frozen=True)
class Array:
    name: str
    level: str | None
    chunk_bytes: int | None
    members: tuple[str, ...]  # whole disks


@dataclass(frozen=True)
class Targets:
    disks: tuple[str, ...]  # whole disks whose requests are counted
    arrays: tuple[Array, ...] = field(default=())
    stacked: tuple[str, ...] = ()  # bio-based devices on the way (md, dm): traced to show 0


def devno_of(tree: SysTree, name: str) -> tuple[int, int]:
    text = tree.read(f"/sys/block/{name}/dev")
    if not text:
        raise DeviceNotFound(name)
    major, minor = text.split(":")
    return int(major), int(minor)


def kernel_dev(major: int, minor: int) -> int:
    """dev_t as the block tracepoints carry it (MKDEV: major << 20 | minor)."""
    return (major << 20) | minor


def _name_from_devno(tree: SysTree, major: int, minor: int, path: str) -> str:
    real = tree.realpath(f"/sys/dev/block/{major}:{minor}")
    if not tree.exists(f"/sys/dev/block/{major}:{minor}"):
        raise UsageError(
            f"{path} is not on a block device (device {major}:{minor}: tmpfs, overlay, "
            "network or FUSE filesystem)",
            hint="trace a path on a filesystem backed by a drive, or name drives with --devices",
        )
    return Path(real).name


def expand(tree: SysTree, name: str) -> Targets:
    """Leaf disks under *name* (through md/dm slaves, and an NVMe multipath head's paths),
    with the md arrays on the way."""
    disk = disk_of(tree, name)
    if disk is None:
        raise DeviceNotFound(name)
    # an NVMe namespace shared over fabrics is a bio-based head: its requests are its
    # paths' (nvmeXcYnZ, hidden), listed in multipath/
    slaves = tree.listdir(f"/sys/block/{disk}/slaves")
    paths = [] if slaves else mpath_paths(tree, disk)
    if paths and not all(tree.exists(f"/sys/block/{p}/dev") for p in paths):
        # the block tracepoints name a request's disk by its device number, which a hidden
        # path has none of on this kernel: its requests cannot be told apart
        raise UsageError(
            f"{disk} is an NVMe multipath head whose paths ({', '.join(paths)}) have no device "
            "number on this kernel: their requests cannot be counted per drive",
            hint="load nvme_core with multipath=N (kernel command line nvme_core.multipath=N): "
            "each namespace is then a disk of its own, traced like a local drive",
        )
    slaves = slaves or paths
    if not slaves:
        return Targets(disks=(disk,))
    disks: list[str] = []
    arrays: list[Array] = []
    stacked = [disk]
    for s in slaves:
        sub = expand(tree, s)
        disks += [d for d in sub.disks if d not in disks]
        arrays += sub.arrays
        stacked += sub.stacked
    if tree.exists(f"/sys/block/{disk}/md"):
        chunk = tree.read_int(f"/sys/block/{disk}/md/chunk_size")
        arrays.insert(
            0,
            Array(
                name=disk,
                level=tree.read(f"/sys/block/{disk}/md/level"),
                chunk_bytes=chunk or None,
                members=tuple(disks),
            ),
        )
    return Targets(disks=tuple(disks), arrays=tuple(arrays), stacked=tuple(stacked))


def resolve_path(tree: SysTree, path: str) -> Targets:
    try:
        st = os.stat(path)
    except FileNotFoundError as exc:
        raise UsageError(
            f"{path} does not exist", hint="--target takes a file, directory or block device"
        ) from exc
    if stat.S_ISBLK(st.st_mode):
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    else:
        major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    return expand(tree, _name_from_devno(tree, major, minor, path))


def resolve_devices(tree: SysTree, names: list[str]) -> Targets:
    disks: list[str] = []
    arrays: list[Array] = []
    stacked: list[str] = []
    for raw in names:
        name = raw.strip().removeprefix("/dev/")
        if not name:
            continue
        if os.path.islink(raw):
            name = os.path.basename(os.path.realpath(raw))
        if disk_of(tree, name) is None:
            raise DeviceNotFound(raw)
        t = expand(tree, name)
        disks += [d for d in t.disks if d not in disks]
        arrays += [a for a in t.arrays if a not in arrays]
        stacked += [s for s in t.stacked if s not in stacked]
    if not disks:
        raise UsageError("no devices named", hint="--devices nvme0n1,nvme1n1")
    return Targets(tuple(disks), tuple(arrays), tuple(stacked))


def merged(a: Targets, b: Targets) -> Targets:
    """The drives of both, each once, in the order they were named."""
    return Targets(
        disks=tuple(dict.fromkeys([*a.disks, *b.disks])),
        arrays=tuple(dict.fromkeys(a.arrays + b.arrays)),
        stacked=tuple(dict.fromkeys([*a.stacked, *b.stacked])),
    )


def nvme_drives(tree: SysTree) -> Targets:
    """Every NVMe drive of the host: what a trace counts when told no drive."""
    nvme = [d for d in tree.listdir("/sys/block") if d.startswith("nvme")]
    if not nvme:
        raise UsageError(
            "no drives to trace: this host has no NVMe drives",
            hint="name drives with --devices loop0,vda or a path with --target",
        )
    return resolve_devices(tree, nvme)


def select(tree: SysTree, devices: str | None, path: str | None) -> Targets:
    """--devices (comma-separated) and --target together; every NVMe drive when neither
    names one."""
    targets = Targets(disks=())
    if devices:
        targets = resolve_devices(tree, devices.split(","))
    if path:
        targets = merged(targets, resolve_path(tree, path))
    return targets if targets.disks else nvme_drives(tree)
