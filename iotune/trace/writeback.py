"""Dirty pages written back before a trace counts the drives, without waiting on others.

``sync(2)`` writes back every file system of the host, and waits on each: one on an NVMe over
Fabrics namespace whose path is lost holds it until the controller's ``ctrl_loss_tmo`` (600 s
by default), and a run that only wanted its own drives quiet stands still that long.
``syncfs(2)`` writes back one file system; a run syncs those on the drives it traces, each
once, and those its own paths lie on."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from pathlib import Path

from iotune.errors import DeviceNotFound, UsageError
from iotune.probes.mounts import existing_ancestor, read_mounts
from iotune.probes.sysfs import SysTree
from iotune.trace.targets import expand

_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(path: str | Path) -> None:
    """Write back the file system *path* lies on (its nearest existing ancestor)."""
    p = existing_ancestor(Path(path))
    fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs {p}: {os.strerror(err)}")
    finally:
        os.close(fd)


def filesystems_on(tree: SysTree, disks: Iterable[str]) -> list[str]:
    """The mount points of the file systems on *disks* (through partitions, md and dm), one
    per file system."""
    want = set(disks)
    seen: set[str] = set()
    points: list[str] = []
    for m in read_mounts(tree):
        major, _, _ = m.devno.partition(":")
        if m.devno in seen or major in ("", "0"):  # 0: tmpfs, overlay, proc and the like
            continue
        if not tree.exists(f"/sys/dev/block/{m.devno}"):
            continue
        try:
            under = expand(tree, Path(tree.realpath(f"/sys/dev/block/{m.devno}")).name).disks
        except (DeviceNotFound, UsageError):
            continue
        if want.intersection(under):
            seen.add(m.devno)
            points.append(m.mountpoint)
    return points


def write_back(tree: SysTree, disks: Iterable[str], paths: Iterable[str | Path] = ()) -> int:
    """syncfs the file systems on *disks* and those *paths* lie on, each once; how many."""
    done: set[int] = set()
    for point in [*filesystems_on(tree, disks), *paths]:
        try:
            dev = os.stat(existing_ancestor(Path(point))).st_dev
        except OSError:
            continue
        if dev not in done:
            done.add(dev)
            syncfs(point)
    return len(done)
