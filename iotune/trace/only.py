"""A trace of one workload's requests on a shared drive: ``--pid PID`` (the process and
everything it starts, from any of its threads) or ``--cgroup PATH`` (a cgroup v2 and the
cgroups below it). The programs count a request when its first bio was submitted by them
(bpf/iotune.h ONLY_*); the kernel's per-drive counters hold everyone's, so the cross-check
becomes a share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from iotune.errors import UsageError
from iotune.trace import model
from iotune.trace.diskstats import DiskStat


def check_pid(pid: int, proc: Path = Path("/proc")) -> None:
    """A running process, or a UsageError."""
    if pid <= 0 or not (proc / str(pid)).is_dir():
        raise UsageError(
            f"--pid {pid}: no such process",
            hint="'ps -e' lists the running processes; or trace a COMMAND: iotune trace -- CMD",
        )


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """*pid* and the processes below it now (their children are added as they fork)."""
    parent: dict[int, int] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses
        parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, todo = [pid], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        tree += kids
        todo += kids
    return tree


def cgroup_dir(path: str, mounts: Path = Path("/proc/self/mounts")) -> Path:
    """The directory of the cgroup v2 at *path*, resolved (the tracer opens it: the kernel
    matches a task in it or in any cgroup below it), or a UsageError where *path* is not
    one."""
    p = Path(path).resolve()
    roots = [
        Path(f.split()[1]) for f in mounts.read_text().splitlines() if f.split()[2:3] == ["cgroup2"]
    ]
    if not p.is_dir() or not any(p == r or r in p.parents for r in roots):
        where = ", ".join(map(str, roots)) or "none mounted"
        raise UsageError(
            f"--cgroup {path}: not a cgroup v2 directory (cgroup2 at: {where})",
            hint="name a directory under the cgroup2 mount, e.g. /sys/fs/cgroup/system.slice/X",
        )
    return p


def describe(pid: int | None, cgroup: str | None) -> dict[str, Any] | None:
    """The filter as trace.json records it (None: every request)."""
    if pid:
        return {"pid": pid}
    if cgroup:
        return {"cgroup": str(Path(cgroup).resolve())}
    return None


def check(
    ops: dict[str, model.OpStats], kernel: DiskStat, pid: int | None, cgroup: str | None
) -> dict[str, Any]:
    """The cross-check under a filter: the traced requests as a share of the kernel's,
    which counts every process's."""
    what = f"pid {pid}" if pid else f"cgroup {cgroup}"
    parts = []
    for op, total in (("read", kernel.read_ios), ("write", kernel.write_ios)):
        mine = ops[op].requests or 0
        parts.append(f"{op}s {mine} of the drive's {total}")
    return {
        "exact": None,
        "summary": f"only {what}'s requests: " + ", ".join(parts),
    }
