"""Which file systems a run writes back before its trace: those on the traced drives only."""

from __future__ import annotations

from pathlib import Path

from iotune.probes.sysfs import SysTree
from iotune.trace.writeback import filesystems_on

MOUNTINFO = """\
1 0 0:21 / / rw - overlay overlay rw
2 1 259:1 / /boot rw,relatime - ext4 /dev/nvme0n1p1 rw
3 1 9:0 / /mnt/fast rw,relatime - xfs /dev/md0 rw
4 1 9:0 /swap /srv/swap rw,relatime - xfs /dev/md0 rw
5 1 259:9 / /mnt/remote rw,relatime - xfs /dev/nvme9n1 rw
6 1 0:50 / /dev/shm rw - tmpfs tmpfs rw
7 1 7:0 / /mnt/gone rw - ext4 /dev/loop0 rw
"""


def _tree(root: Path) -> SysTree:
    def disk(name: str, devno: str, slaves: tuple[str, ...] = ()) -> None:
        d = root / "sys/block" / name
        (d / "slaves").mkdir(parents=True)
        (d / "dev").write_text(devno + "\n")
        for s in slaves:
            (d / "slaves" / s).touch()
        (root / "sys/dev/block" / devno).symlink_to(d)

    (root / "sys/dev/block").mkdir(parents=True)
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/mountinfo").write_text(MOUNTINFO)
    disk("nvme0n1", "259:0")
    part = root / "sys/block/nvme0n1/nvme0n1p1"
    part.mkdir()
    (part / "partition").write_text("1\n")
    (part / "dev").write_text("259:1\n")
    (root / "sys/dev/block/259:1").symlink_to(part)
    disk("nvme1n1", "259:2")
    disk("nvme2n1", "259:3")
    disk("nvme9n1", "259:9")  # another drive's: a lost NVMe-oF namespace, say
    disk("md0", "9:0", ("nvme1n1", "nvme2n1"))
    (root / "sys/block/md0/md").mkdir()
    (root / "sys/block/md0/md/level").write_text("raid0\n")
    (root / "sys/block/md0/md/chunk_size").write_text("524288\n")
    return SysTree(root)  # 7:0 (loop0) has no /sys/dev/block entry: detached since


def test_the_file_systems_on_the_traced_drives_each_once(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    # a member of the array: the array's file system, once though mounted twice
    assert filesystems_on(tree, ["nvme2n1"]) == ["/mnt/fast"]
    # a partition's file system is its disk's
    assert filesystems_on(tree, ["nvme0n1", "nvme1n1"]) == ["/boot", "/mnt/fast"]
    # nothing on drives not traced, nor of tmpfs and overlay, nor of a device gone
    assert filesystems_on(tree, ["nvme9n1"]) == ["/mnt/remote"]
    assert filesystems_on(tree, ["loop0", "vda"]) == []
