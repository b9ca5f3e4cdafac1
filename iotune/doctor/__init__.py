"""`iotune doctor`: is this host ready? Each check reports PASS/WARN/FAIL, what it found and
the exact fix, and names the command families (raid, sweep, trace, train) that need it.
The host's own checks are here, the tracer's in :mod:`iotune.doctor.tracer`, training's in
:mod:`iotune.doctor.train`; :func:`run_checks` runs them all.

May import: iotune.trace (a load of its programs), iotune.checks, iotune.probes, iotune.proc,
iotune.paths, iotune.units, iotune.errors. Not the sweeps, the run or the command line.
"""

from __future__ import annotations

import ctypes.util
import os
import platform
import re
import resource
from pathlib import Path
from typing import Any

from iotune import proc

# the checks other commands make too live in iotune.checks; the doctor shows them all
from iotune.checks import (
    ALL,
    Check,
    Family,
    Status,
    check_bcc,
    check_block_tracepoint,
    probe_torch,
    tracefs_dir,
)
from iotune.doctor.tracer import (
    check_bpf_load,
    check_btf,
    check_headers,
    check_libbpf,
    check_libbpf_load,
    check_tracefs,
    settle_tracer,
)
from iotune.doctor.train import check_bf16, checks_from_torch
from iotune.errors import IotuneError, NotRootError
from iotune.probes.meminfo import meminfo
from iotune.probes.sysfs import SysTree
from iotune.units import GIB

__all__ = [
    "apply_fixes",
    "check_bf16",
    "check_btf",
    "check_kernel",
    "check_libaio",
    "check_md",
    "check_memlock",
    "check_memory",
    "check_root",
    "check_tool",
    "check_tracefs",
    "checks_from_torch",
    "fix_tracefs",
    "missing",
    "ready",
    "run_checks",
    "settle_tracer",
]


def check_root() -> Check:
    if os.geteuid() == 0:
        return Check("root", Status.PASS, "running as root", needed_by=ALL - {Family.TRAIN})
    return Check(
        "root",
        Status.FAIL,
        f"running as uid {os.geteuid()}",
        "run as root (sudo): probes open block devices, BPF needs CAP_BPF/CAP_SYS_ADMIN",
        ALL - {Family.TRAIN},
    )


def check_kernel() -> Check:
    release = platform.release()
    m = re.match(r"(\d+)\.(\d+)", release)
    version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if version < (5, 4):
        return Check(
            "kernel", Status.WARN, f"{release}: older than 5.4", "a 5.4+ kernel is tested", ALL
        )
    return Check("kernel", Status.PASS, release)


def _tool_version(tool: str, args: list[str], pattern: str) -> str | None:
    if proc.which(tool) is None:
        return None
    try:
        done = proc.run([tool, *args], check=False, timeout=20)
    except IotuneError:
        return None
    m = re.search(pattern, done.stdout + done.stderr)
    return m.group(1) if m else (done.stdout + done.stderr).strip().splitlines()[0]


def check_tool(
    tool: str, package: str, args: list[str], pattern: str, needed: set[Family]
) -> Check:
    version = _tool_version(tool, args, pattern)
    if version is None:
        return Check(
            tool, Status.FAIL, "not installed", f"apt-get install {package}", frozenset(needed)
        )
    return Check(tool, Status.PASS, f"{proc.which(tool)} {version}", needed_by=frozenset(needed))


def check_md(tree: SysTree) -> Check:
    families = frozenset({Family.RAID})
    mdstat = tree.read("/proc/mdstat")
    if mdstat and "[raid0]" in mdstat:
        return Check("md raid0", Status.PASS, "raid0 personality loaded", needed_by=families)
    release = platform.release()
    for listing in (
        f"/lib/modules/{release}/modules.dep",
        f"/lib/modules/{release}/modules.builtin",
    ):
        text = tree.read_raw(listing) or ""
        if re.search(r"(^|/)raid0\.ko", text, re.M):
            how = "built in" if listing.endswith("builtin") else "module available (modprobe raid0)"
            return Check("md raid0", Status.PASS, how, needed_by=families)
    return Check(
        "md raid0",
        Status.FAIL,
        f"the running kernel {release} has no md raid0 driver",
        "boot a kernel with CONFIG_MD_RAID0 (e.g. the distribution kernel); "
        "'iotune raid' cannot build arrays here",
        families,
    )


def check_libaio(tree: SysTree) -> Check:
    families = frozenset({Family.SWEEP, Family.TRAIN})
    lib = ctypes.util.find_library("aio")
    # the compiler's own include path, then what the environment adds to it (DeepSpeed's
    # op builder compiles with the same environment)
    dirs = ["/usr/include", "/usr/local/include"]
    for var in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH"):
        dirs += [d for d in os.environ.get(var, "").split(":") if d]
    header = next((f"{d}/libaio.h" for d in dirs if Path(d, "libaio.h").exists()), None)
    if lib and header:
        return Check("libaio", Status.PASS, f"{lib}, {header}", needed_by=families)
    missing = "library" if not lib else "header (libaio.h)"
    return Check(
        "libaio",
        Status.FAIL,
        f"{missing} missing",
        "apt-get install libaio-dev (DeepSpeed builds its async_io op against it)",
        families,
    )


def check_memory(tree: SysTree) -> Check:
    avail = meminfo(tree).get("MemAvailable")
    if avail is None:
        return Check("free RAM", Status.WARN, "MemAvailable not found in /proc/meminfo")
    gib = avail / GIB
    if gib < 8:
        return Check(
            "free RAM",
            Status.WARN,
            f"{gib:.1f} GiB available",
            "offloaded training keeps gradients and pinned buffers in RAM: only tiny presets fit",
        )
    return Check("free RAM", Status.PASS, f"{gib:.1f} GiB available")


def check_memlock() -> Check:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if os.geteuid() == 0:
        return Check("ulimit -l", Status.PASS, "root: CAP_IPC_LOCK, pinned memory is not limited")
    if soft == resource.RLIM_INFINITY:
        return Check("ulimit -l", Status.PASS, "unlimited")
    return Check(
        "ulimit -l",
        Status.WARN,
        f"{soft // 1024} KiB of locked memory",
        "raise it for pinned AIO buffers: 'ulimit -l unlimited' or memlock in limits.conf",
    )


def run_checks(
    tree: SysTree, *, build_ops: bool = False, torch_info: dict[str, Any] | None = None
) -> list[Check]:
    checks: list[Check] = [
        check_root(),
        check_kernel(),
        check_btf(tree),
        check_libbpf(),
        check_libbpf_load(tree),
        check_tracefs(tree),
        check_block_tracepoint(tree),
        check_headers(tree),
        check_bcc(),
        check_bpf_load(tree),
        check_tool("mdadm", "mdadm", ["--version"], r"(v[\d.]+)", {Family.RAID}),
        check_tool("mkfs.xfs", "xfsprogs", ["-V"], r"version ([\d.]+)", {Family.RAID}),
        check_tool("wipefs", "util-linux", ["--version"], r"([\d.]+)", {Family.RAID}),
        check_md(tree),
        check_tool("fio", "fio", ["--version"], r"fio-([\d.]+)", {Family.SWEEP}),
        check_libaio(tree),
    ]
    info = torch_info if torch_info is not None else probe_torch(build_ops, bf16_cost=True)
    checks += checks_from_torch(info)
    checks += [check_bf16(tree, info), check_memory(tree), check_memlock()]
    return settle_tracer(checks)


def ready(checks: list[Check], family: Family) -> list[Check]:
    """The failed checks that *family* needs (empty: ready)."""
    return [c for c in checks if c.status is Status.FAIL and family in c.needed_by]


def missing(checks: list[Check]) -> dict[str, list[str]]:
    """For every family, the names of the failed checks it needs (an empty list: ready)."""
    return {f.value: [c.name for c in ready(checks, f)] for f in Family}


def apply_fixes(tree: SysTree) -> list[str]:
    """--fix: the safe fixes this host needs (mount tracefs), as the commands applied."""
    if tracefs_dir(tree) is not None:
        return []
    if os.geteuid() != 0:
        raise NotRootError("iotune doctor --fix")
    return [" ".join(fix_tracefs())]


def fix_tracefs() -> list[str]:
    """Mount tracefs (the only fix doctor applies itself: it changes nothing on disk)."""
    argv = ["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"]
    proc.run(argv, timeout=30)
    return argv
