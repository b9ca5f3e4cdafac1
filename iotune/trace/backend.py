"""Which tracer a trace uses: ``bcc`` (exact request sizes through eBPF: needs root, tracefs,
bcc, and a block:block_rq_issue tracepoint with the fields the program reads) or
``diskstats`` (the kernel's per-drive totals, no sizes). ``auto`` takes bcc when all of that
is there, and says what is missing when it falls back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from iotune.checks import Status, check_bcc, check_block_tracepoint, tracefs_dir
from iotune.errors import IotuneError, NotRootError
from iotune.probes.sysfs import SysTree


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # "bcc" | "diskstats"
    warning: str | None = None  # why auto fell back to diskstats


def bcc_importable() -> bool:
    return check_bcc().status is not Status.FAIL


def choose_backend(
    requested: str,
    tree: SysTree,
    *,
    is_root: bool,
    bcc_available: Callable[[], bool] = bcc_importable,
) -> BackendChoice:
    """*requested* is auto, bcc or diskstats; bcc asked for by name must work or fail here."""
    if requested != "auto":
        if requested == "bcc" and not is_root:
            raise NotRootError("iotune trace --backend bcc")
        if requested == "bcc":
            tp = check_block_tracepoint(tree)
            if tp.status is Status.FAIL:
                raise IotuneError(
                    f"cannot trace with bcc: {tp.found}", hint=tp.fix or "use --backend diskstats"
                )
        return BackendChoice(requested)
    problems = []
    if not is_root:
        problems.append("not root")
    if tracefs_dir(tree) is None:
        problems.append("tracefs not mounted")
    if not bcc_available():
        problems.append("bcc not importable")
    tp = check_block_tracepoint(tree)
    if tp.status is Status.FAIL and tracefs_dir(tree) is not None:
        problems.append(tp.found)  # e.g. a kernel whose block_rq_issue lacks the bytes field
    if problems:
        return BackendChoice(
            "diskstats",
            f"using the diskstats backend ({', '.join(problems)}): totals per drive only, "
            "no request sizes, no focus/other split; 'iotune doctor --for trace' says what to fix",
        )
    return BackendChoice("bcc")
