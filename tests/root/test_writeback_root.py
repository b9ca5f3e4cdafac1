"""A run's write-back before its trace, on the real kernel: syncfs of the file systems on the
traced drives, not sync(2) of every file system (one on a lost NVMe-oF namespace holds
sync until ctrl_loss_tmo)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from iotune.probes.sysfs import SysTree
from iotune.trace.writeback import filesystems_on, write_back

M = 2**20


def _written(dev: str) -> int:
    """Bytes the kernel has completed as writes on *dev* (diskstats' sectors written)."""
    fields = Path(f"/sys/block/{Path(dev).name}/stat").read_text().split()
    return int(fields[6]) * 512


def test_only_the_traced_drives_file_systems_are_written_back(
    loop_device: Callable[..., str],
) -> None:
    traced = loop_device(fs="ext4", mount=True)
    other = loop_device(fs="ext4", mount=True)
    mnt, other_mnt = loop_device.mounts  # type: ignore[attr-defined]
    tree = SysTree("/")
    assert filesystems_on(tree, [Path(traced).name]) == [str(mnt)]
    for m in (mnt, other_mnt):
        (m / "dirty.bin").write_bytes(os.urandom(8 * M))  # in the page cache, dirty
    before = {d: _written(d) for d in (traced, other)}
    # the traced drive's file system, and the one a path of the run lies on (the same)
    assert write_back(tree, [Path(traced).name], [mnt / "swap" / "not-yet"]) == 1
    assert _written(traced) - before[traced] >= 8 * M
    # the other's data is still dirty (at most a journal commit of its metadata went out)
    assert _written(other) - before[other] < 1 * M
    assert write_back(tree, [], [other_mnt]) == 1
    assert _written(other) - before[other] >= 8 * M
