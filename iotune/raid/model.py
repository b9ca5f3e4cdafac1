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
