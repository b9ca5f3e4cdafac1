"""Records of the raid layer: what the user asked for, the plan, and its steps."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Fs(enum.StrEnum):
    XFS = "xfs"
    EXT4 = "ext4"
    NONE = "none"


LEVELS = (0, 1, 5, 6, 10)
MIN_DEVICES = {0: 2, 1: 2, 5: 3, 6: 4, 10: 2}
#: level → (kernel module to load, personality /proc/mdstat lists once it is there)
MD_DRIVERS = {
    0: ("raid0", "raid0"),
    1: ("raid1", "raid1"),
    5: ("raid456", "raid5"),
    6: ("raid456", "raid6"),
    10: ("raid10", "raid10"),
}


@dataclass(frozen=True)
class RaidRequest:
    name: str
    level: int = 0
    chunk: int = 512 * 1024
    devices: tuple[str, ...] = ()
    all_unused: bool = False
    fs: Fs = Fs.XFS
    mount: str | None = None
    persist: bool = False
    wipe: bool = False
    mkfs_options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """One action: an external command (argv) or a line appended to a file."""

    kind: str  # wipe | create | wait | mkfs | mkdir | mount | conf | fstab | initramfs
    why: str
    argv: tuple[str, ...] = ()
    path: str | None = None  # for conf/fstab: the file
    line: str | None = None  # for conf/fstab: the line appended

    def describe(self) -> str:
        if self.argv:
            import shlex

            return shlex.join(self.argv)
        if self.path and self.line:
            verb = "remove from" if self.kind.startswith("un") else "append to"
            return f"{verb} {self.path}: {self.line}"
        return "(wait for the array, then verify it)" if self.kind == "wait" else f"({self.kind})"


@dataclass(frozen=True)
class HostSetup:
    """Facts the planner needs about the host's configuration (found by the caller)."""

    mdadm_conf: str = "/etc/mdadm/mdadm.conf"
    fstab: str = "/etc/fstab"
    initramfs: tuple[str, ...] | None = ("update-initramfs", "-u")
    initramfs_note: str | None = None


@dataclass(frozen=True)
class Plan:
    request: RaidRequest
    device: str  # /dev/md/NAME
    members: tuple[str, ...]
    member_size: int
    capacity_bytes: int
    data_disks: int
    alignment: str | None
    array_uuid: str
    fs_uuid: str | None
    steps: tuple[Step, ...]
    wipes: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class ArrayInfo:
    """An existing md array as sysfs, blkid and the mount table describe it."""

    name: str
    device: str
    kernel_name: str
    level: str | None
    chunk_bytes: int | None
    state: str | None
    size_bytes: int
    members: list[dict[str, str | None]]
    fs: str | None
    fs_uuid: str | None
    mountpoints: list[str]
    max_sectors_kb: int | None
    minimum_io_size: int | None
    optimal_io_size: int | None
    sync_action: str | None
    sync_completed: str | None
    #: the NVMe-oF namespace under it without a live path (its reads wait), if any
    lost_path: str | None = None
