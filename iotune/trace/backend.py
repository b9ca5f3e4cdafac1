"""Which tracer a trace uses:

- ``libbpf``: exact request sizes through eBPF, one BPF CO-RE object compiled once and
  relocated to the running kernel's BTF by libbpf (needs root, /sys/kernel/btf/vmlinux and
  libbpf 1.x; no compiler, no headers);
- ``bcc``: the same counting, compiled by bcc at every start (needs bcc, LLVM, the kernel's
  headers, tracefs and a block:block_rq_issue tracepoint with the fields it reads); the
  fallback for kernels without BTF;
- ``diskstats``: the kernel's per-drive totals, no sizes.

``auto`` takes libbpf where its object loads, else bcc where all it needs is there, and says
why when it falls back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from iotune.checks import Status, check_bcc, check_block_tracepoint, tracefs_dir
from iotune.errors import IotuneError, NotRootError
from iotune.probes.sysfs import SysTree

#: the backends that count requests with eBPF (the others read diskstats only)
EBPF = ("libbpf", "bcc")


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # "libbpf" | "bcc" | "diskstats"
    warning: str | None = None  # why auto fell back to diskstats
    note: str | None = None  # why auto took bcc rather than libbpf


def bcc_importable() -> bool:
    return check_bcc().status is not Status.FAIL


def libbpf_problem() -> str | None:
    """Why the libbpf tracer cannot run here (None: its object loads and attaches). Loads it
    once, with no device (a fraction of a second)."""
    from iotune.trace.libbpf import LibbpfTracer

    if not SysTree("/").exists("/sys/kernel/btf/vmlinux"):
        return "no kernel BTF (/sys/kernel/btf/vmlinux)"
    try:
        LibbpfTracer(None).close()
    except IotuneError as exc:
        return exc.message
    return None


def traces_requests(backend: str) -> bool:
    return backend in EBPF


def choose_backend(
    requested: str,
    tree: SysTree,
    *,
    is_root: bool,
    bcc_available: Callable[[], bool] = bcc_importable,
    libbpf_unavailable: Callable[[], str | None] = libbpf_problem,
) -> BackendChoice:
    """*requested* is auto, libbpf, bcc or diskstats; one asked for by name must work or
    fail here."""
    if requested in EBPF and not is_root:
        raise NotRootError(f"iotune trace --backend {requested}")
    if requested == "libbpf":
        problem = libbpf_unavailable()
        if problem:
            raise IotuneError(f"cannot trace with libbpf: {problem}", hint="use --backend bcc")
        return BackendChoice(requested)
    if requested != "auto":
        if requested == "bcc":
            tp = check_block_tracepoint(tree)
            if tp.status is Status.FAIL:
                raise IotuneError(
                    f"cannot trace with bcc: {tp.found}", hint=tp.fix or "use --backend diskstats"
                )
        return BackendChoice(requested)
    if not is_root:
        return _diskstats(["not root"])
    no_libbpf = libbpf_unavailable()
    if no_libbpf is None:
        return BackendChoice("libbpf")
    problems = []
    if tracefs_dir(tree) is None:
        problems.append("tracefs not mounted")
    if not bcc_available():
        problems.append("bcc not importable")
    tp = check_block_tracepoint(tree)
    if tp.status is Status.FAIL and tracefs_dir(tree) is not None:
        problems.append(tp.found)  # e.g. a kernel whose block_rq_issue lacks the bytes field
    if problems:
        return _diskstats([f"libbpf: {no_libbpf}", *problems])
    return BackendChoice("bcc", note=f"tracing with bcc: libbpf cannot ({no_libbpf})")


def _diskstats(problems: list[str]) -> BackendChoice:
    return BackendChoice(
        "diskstats",
        f"using the diskstats backend ({', '.join(problems)}): totals per drive only, "
        "no request sizes, no focus/other split; 'iotune doctor --for trace' says what to fix",
    )


def bpf_time(programs: list[tuple[str, int]]) -> dict[str, int] | None:
    """What the tracer's programs cost by the kernel's own clock since they were loaded: the
    summed run_time_ns and run_cnt of their fdinfo. None unless the kernel's BPF statistics
    are on (sysctl kernel.bpf_stats_enabled=1; off by default, as they cost two clock reads
    per program run)."""
    from iotune.trace.mapreader import prog_info

    infos = [prog_info(fd) for _, fd in programs]
    ns = sum(i.get("run_time_ns", 0) for i in infos)
    runs = sum(i.get("run_cnt", 0) for i in infos)
    return {"run_time_ns": ns, "run_cnt": runs} if runs else None


def open_tracer(
    backend: str,
    devs: list[int],
    owners: bool,
    focus: int,
    latency: bool = True,
    only: str | None = None,
    cgroup: str | None = None,
) -> Any:
    """The eBPF tracer of *backend* (libbpf or bcc), attached to *devs*; *focus*: the request
    size whose latency it keeps apart; *latency* False: requests are not timed; *only*
    ("workload", or "cgroup" with the path of its directory *cgroup*): only those requests
    are counted (a cgroup's: those of its processes and of every cgroup below it)."""
    if backend == "libbpf":
        from iotune.trace.libbpf import LibbpfTracer

        return LibbpfTracer(
            devs, owners=owners, focus=focus, latency=latency, only=only, cgroup=cgroup
        )
    from iotune.trace.bpf import ReqSizeTracer

    return ReqSizeTracer(
        devs, owners=owners, focus=focus, latency=latency, only=only, cgroup=cgroup
    )
