"""What a file system wrote of its own (journal or log, and its metadata's home copies)
while a block of a test ran, from the kernel's own counts: beside a trace of the volume, the
writes that are not the files' data.

ext4: each jbd2 transaction's ``jbd2:jbd2_run_stats`` event names the blocks it logged (the
metadata copies, the descriptor and revoke blocks and the commit block) and the metadata
buffers it held, each written home at most once after that commit; a
``jbd2:jbd2_write_superblock`` event is one block more. XFS: the log's 512-byte blocks (the
``log`` line of /sys/fs/xfs/DEV/stats/stats) and the buffers it submits for writing
(``xfs:xfs_buf_submit``). Both commit in the background (ext4's jbd2 every 5 s by default,
XFS's log and AIL on their own clocks), so a slower run holds more of them: a test's bound on
a volume's writes beyond the model's data takes this figure, not a fixed margin."""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from iotune.probes.mounts import read_mounts
from iotune.probes.sysfs import SysTree
from tests.root.conftest import iotune

TRACEFS = Path("/sys/kernel/tracing")
_EVENTS = {
    "ext4": ("jbd2/jbd2_run_stats", "jbd2/jbd2_write_superblock"),
    "xfs": ("xfs/xfs_buf_submit",),
}
_RUN = re.compile(r"jbd2_run_stats: dev (\d+),(\d+) .* blocks (\d+) blocks_logged (\d+)")
_SUPER = re.compile(r"jbd2_write_superblock: dev (\d+),(\d+) ")
_SUBMIT = re.compile(
    r"xfs_buf_submit: dev (\d+):(\d+) daddr \S+ bbcount (0x[0-9a-f]+) .* flags (\S+)"
)


def _filesystem(path: Path) -> tuple[str, str, tuple[int, int]]:
    """The type, the device name and the device number of the file system *path* lies on
    (the mount table as iotune reads it)."""
    st = os.stat(path).st_dev
    devno = (os.major(st), os.minor(st))
    for m in read_mounts(SysTree("/")):
        if m.devno == f"{devno[0]}:{devno[1]}":
            return m.fstype, Path(os.path.realpath(f"/sys/dev/block/{m.devno}")).name, devno
    raise LookupError(f"no block device's file system holds {path}")


def _xfs_log_bytes(dev: str) -> int:
    for line in Path(f"/sys/fs/xfs/{dev}/stats/stats").read_text().splitlines():
        name, *values = line.split()
        if name == "log":
            return int(values[1]) * 512  # xs_log_blocks: 512-byte units of the log's writes
    raise LookupError(f"no log line in XFS's stats of {dev}")


class FsOwnWrites:
    """``with FsOwnWrites(path) as fs: ...``, then ``fs.bytes``: what the file system *path*
    lies on wrote of its own meanwhile (an upper bound: each metadata buffer a transaction
    held counts as written home once), and ``fs.detail`` how it was counted."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.fstype, self.dev, self.devno = _filesystem(self.path)
        if self.fstype not in _EVENTS:
            raise ValueError(f"{self.fstype} holds {path}: only ext4 and XFS are counted")
        self.block = os.statvfs(self.path).f_bsize
        self.instance = TRACEFS / "instances" / f"iotune-fs-{uuid.uuid4().hex[:8]}"
        self.bytes = 0
        self.detail: dict[str, int] = {}
        self._log0 = 0

    def _event(self, name: str, on: bool) -> None:
        (self.instance / "events" / name / "enable").write_text("1" if on else "0")

    def __enter__(self) -> FsOwnWrites:
        self.instance.mkdir()
        for name in _EVENTS[self.fstype]:
            self._event(name, True)
        if self.fstype == "xfs":
            self._log0 = _xfs_log_bytes(self.dev)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            for name in _EVENTS[self.fstype]:
                self._event(name, False)
            text = (self.instance / "trace").read_text()
            self._count(text)
        finally:
            self.instance.rmdir()

    def _ours(self, m: re.Match[str]) -> bool:
        return (int(m.group(1)), int(m.group(2))) == self.devno

    def _count(self, text: str) -> None:
        if "LOST" in text:  # the instance's ring overflowed: the count would be short
            raise RuntimeError(
                f"tracefs lost events counting the own writes of {self.path}'s file system"
            )
        if self.fstype == "ext4":
            runs = [m for m in _RUN.finditer(text) if self._ours(m)]
            held = sum(int(m.group(3)) for m in runs)
            logged = sum(int(m.group(4)) for m in runs)
            supers = sum(1 for m in _SUPER.finditer(text) if self._ours(m))
            self.detail = {"transactions": len(runs), "logged_blocks": logged,
                           "held_blocks": held, "superblock_writes": supers}  # fmt: skip
            self.bytes = (logged + held + supers) * self.block
        else:
            bufs = [m for m in _SUBMIT.finditer(text) if self._ours(m)]
            wrote = sum(int(m.group(3), 16) * 512 for m in bufs if "WRITE" in m.group(4).split("|"))
            log = _xfs_log_bytes(self.dev) - self._log0
            self.detail = {"log_bytes": log, "buffer_bytes": wrote}
            self.bytes = log + wrote


def traced_run(out: Path, offload: Path, *args: str) -> dict[str, Any]:
    """``iotune --json trace --run tiny_opt_nvme`` offloading to *offload*, its document, and
    in it ``fs_own_writes``: what the offload volume's file system wrote of its own meanwhile
    (ext4's journal, XFS's log, their metadata), by the kernel's count."""
    with FsOwnWrites(offload) as fs:
        p = iotune("--json", "trace", "--run", "tiny_opt_nvme", "--nvme-path", str(offload),
                   "--out", str(out), *args)  # fmt: skip
    doc: dict[str, Any] = json.loads(p.stdout)
    doc["fs_own_writes"] = {"bytes": fs.bytes, **fs.detail}
    return doc
