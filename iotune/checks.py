"""Host facts that several commands check before they run, each as the doctor reports it:
the block tracepoint and tracefs (trace), bcc (trace), the torch/DeepSpeed probe in a worker
(sweep, train), a volume's filesystem and O_DIRECT (sweep, train, study). The doctor shows
them all; the commands that need one call it from here."""

from __future__ import annotations

import contextlib
import enum
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.errors import CommandFailed
from iotune.probes.sysfs import SysTree


class Status(enum.StrEnum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"


class Family(enum.StrEnum):
    RAID = "raid"
    SWEEP = "sweep"
    TRACE = "trace"
    TRAIN = "train"


ALL = frozenset(Family)


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    found: str
    fix: str | None = None
    needed_by: frozenset[Family] = field(default_factory=frozenset)


def tracefs_dir(tree: SysTree) -> str | None:
    for rel in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"):
        if tree.exists(f"{rel}/events"):
            return rel
    return None


def check_block_tracepoint(tree: SysTree) -> Check:
    base = tracefs_dir(tree)
    if base is None:
        return Check(
            "block tracepoints",
            Status.FAIL,
            "tracefs not mounted, cannot look",
            "mount tracefs first",
            frozenset({Family.TRACE}),
        )
    fmt = tree.read(f"{base}/events/block/block_rq_issue/format")
    if fmt is None:
        return Check(
            "block tracepoints",
            Status.FAIL,
            "block:block_rq_issue does not exist",
            "the kernel needs CONFIG_BLK_DEV_IO_TRACE / tracepoints in the block layer",
            frozenset({Family.TRACE}),
        )
    fields = re.findall(r"field:[^;]*?(\w+)(?:\[\d*\])?;", fmt)
    wanted = {"dev", "sector", "nr_sector", "bytes", "rwbs"}
    missing = sorted(wanted - set(fields))
    if missing:
        return Check(
            "block tracepoints",
            Status.FAIL,
            f"block:block_rq_issue lacks field(s) {', '.join(missing)}",
            "iotune's tracer needs dev, sector, nr_sector, bytes and rwbs (kernel 5.x+)",
            frozenset({Family.TRACE}),
        )
    return Check(
        "block tracepoints",
        Status.PASS,
        "block:block_rq_issue with dev, sector, nr_sector, bytes, rwbs",
        needed_by=frozenset({Family.TRACE}),
    )


def import_bcc() -> Any:
    import bcc  # system python3-bpfcc, linked into the virtualenv by scripts/setup.sh

    return bcc


def check_bcc() -> Check:
    try:
        bcc = import_bcc()
    except ImportError as exc:
        return Check(
            "bcc",
            Status.FAIL,
            f"cannot import bcc ({exc})",
            "apt-get install python3-bpfcc bpfcc-tools; then scripts/setup.sh links it into "
            "the virtualenv (bcc is not on PyPI)",
            frozenset({Family.TRACE}),
        )
    version = getattr(bcc, "__version__", "?")
    return Check("bcc", Status.PASS, f"bcc {version}", needed_by=frozenset({Family.TRACE}))


def probe_torch(build: bool, timeout: float = 600.0, bf16_cost: bool = False) -> dict[str, Any]:
    """Run the torch/DeepSpeed probe in a worker process (it imports torch and may JIT-build;
    with *bf16_cost* it also times bf16 against float32 on the CPU)."""
    args = [*(["--build"] if build else []), *(["--bf16-cost"] if bf16_cost else [])]
    try:
        return proc.run_worker("iotune.workers.torch_probe", *args, timeout=timeout)
    except CommandFailed as exc:
        return {"worker_error": exc.message}


def o_direct_error(directory: Path) -> OSError | None:
    """Create and remove an O_DIRECT file in *directory*: None, or why it failed."""
    probe = directory / f".iotune-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
        os.close(fd)
    except OSError as exc:
        return exc
    finally:
        # a read-only volume refuses even the unlink of a file that is not there
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
    return None


def fstype(path: Path) -> str:
    """The filesystem type of the longest mount point that is a prefix of *path*."""
    best, kind = "", "?"
    with open("/proc/self/mounts") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) < 3:
                continue
            mp, p = parts[1], str(path.resolve())
            inside = p == mp or p.startswith(mp.rstrip("/") + "/")
            if inside and len(mp) >= len(best):
                best, kind = parts[1], parts[2]
    return kind
