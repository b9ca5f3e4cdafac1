"""`iotune sweep-threads`: DeepSpeedCPUAdam step time per OpenMP thread count."""

from __future__ import annotations

import json
import os
import re
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.errors import CommandFailed, IotuneError, UsageError, last_line
from iotune.records import THREADS_RESULT
from iotune.units import GIB

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}
#: a sweep's record, read by 'iotune estimate --threads-config' and 'iotune report'
#: fp32 parameter, gradient and two Adam moments
BYTES_PER_PARAM = 16


def parse_params(text: str) -> int:
    """2B, 500M, 1e8, 100000000 → a parameter count (decimal units, as model sizes are)."""
    t = text.strip().upper()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMBG]?)", t)
    if m:
        value = int(float(m.group(1)) * _SUFFIX[m.group(2)])
    else:
        try:
            value = int(float(t))
        except ValueError:
            value = 0
    if value <= 0:
        raise UsageError(
            f"--params {text!r} is not a parameter count", hint="e.g. --params 2B or 500M"
        )
    return value


#: seconds a worker may take to build its optimizer, and to take one step
BUILD_TIMEOUT_S = 1800.0
STEP_TIMEOUT_S = 600.0
#: the memory probe's arrays: three of 2^26 fp32 elements (256 MiB each, far above any
#: cache), fewer where the host's available memory is short
MEMORY_ELEMENTS = 1 << 26
MEMORY_REPEATS = 5


def share(n: int, ranks: int) -> int:
    """Each rank's share of *n* parameters: ZeRO partitions the optimizer's state evenly,
    the last partition padded to the others' size."""
    return -(-n // ranks)


def rank_row(n: int, threads: int, ranks: int, times: Sequence[Sequence[float]]) -> dict[str, Any]:
    """A row of *ranks* ranks stepping at once, from each rank's step times (ms, step by
    step): a step takes as long as its slowest rank (the ranks meet at each step), and
    the row's figures are those steps'; each rank's own median is kept beside them."""
    steps = [max(at) for at in zip(*times, strict=True)]
    return {
        "threads": threads,
        "ranks": ranks,
        "params": share(n, ranks),
        "step_ms": steps,
        "step_ms_median": statistics.median(steps),
        "step_ms_min": min(steps),
        "step_ms_max": max(steps),
        "rank_step_ms_median": [statistics.median(t) for t in times],
    }


def _side_by_side(n: int, threads: int, ranks: int, repeats: int) -> dict[str, Any]:
    """*ranks* workers of CPU Adam at once, each on its share at *threads* threads, every
    step started together (iotune.workers.adam_step --serve)."""
    part = share(n, ranks)
    env = {**proc.worker_env(), "OMP_NUM_THREADS": str(threads)}
    workers = [
        proc.JsonWorker(proc.command("iotune.workers.adam_step", str(part), "--serve"), env=env)
        for _ in range(ranks)
    ]
    try:
        with ThreadPoolExecutor(ranks) as pool:

            def each(req: dict[str, Any], timeout: float) -> list[dict[str, Any]]:
                return list(pool.map(lambda w: w.ask(req, timeout), workers))

            each({"ready": True}, BUILD_TIMEOUT_S)
            times: list[list[float]] = [[] for _ in workers]
            for _ in range(repeats):
                for mine, got in zip(times, each({"step": True}, STEP_TIMEOUT_S), strict=True):
                    mine.append(float(got["ms"]))
    finally:
        for w in workers:
            w.close(kill=True)
            w.release()
    return rank_row(n, threads, ranks, times)


def run_thread_sweep(
    n: int,
    threads: Sequence[int],
    repeats: int,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    ranks: Sequence[int] = (1,),
) -> list[dict[str, Any]]:
    """One row per rank count and thread count: one rank in a process of its own, several
    side by side (:func:`_side_by_side`)."""
    rows = []
    for r in ranks:
        for t in threads:
            row: dict[str, Any] = {"threads": t, "ranks": r, "params": share(n, r)}
            try:
                if r == 1:
                    row.update(
                        proc.run_worker(
                            "iotune.workers.adam_step",
                            str(n),
                            str(repeats),
                            env={"OMP_NUM_THREADS": str(t)},
                            timeout=BUILD_TIMEOUT_S,
                        )
                    )
                else:
                    row.update(_side_by_side(n, t, r, repeats))
                row["status"] = "ok"
            except CommandFailed as exc:
                row["status"] = "failed"
                row["error"] = last_line(exc.stderr_tail) or str(exc.returncode)
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def memory_elements(available: int) -> int:
    """The memory probe's array length: MEMORY_ELEMENTS, or what a quarter of the available
    memory holds in three fp32 arrays, whichever is less."""
    return max(1 << 20, min(MEMORY_ELEMENTS, available // 4 // (3 * 4)))


def run_memory_probe(threads: Sequence[int], available: int) -> dict[str, Any]:
    """The host's memory bandwidth at each thread count (iotune.workers.membw), and the best
    triad; ``{"error": ...}`` where the probe failed (the sweep's rows stand without it)."""
    try:
        doc = proc.run_worker(
            "iotune.workers.membw",
            str(memory_elements(available)),
            str(MEMORY_REPEATS),
            ",".join(map(str, threads)),
            timeout=600,
        )
    except CommandFailed as exc:
        return {"error": last_line(exc.stderr_tail) or str(exc.returncode)}
    best = max(doc["rows"], key=lambda r: r["triad_bytes_s"])
    return {**doc, "best": {"threads": best["threads"], "triad_bytes_s": best["triad_bytes_s"]}}


def save_threads(out: Path, doc: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / THREADS_RESULT).write_text(json.dumps(doc, indent=2) + "\n")


def check_memory(n: int, params: str, available: int) -> None:
    """The optimizer's state must fit in RAM with a fifth to spare."""
    need = n * BYTES_PER_PARAM
    if need > available * 0.8:
        raise UsageError(
            f"{params} parameters need {need / GIB:.1f} GiB of RAM ({BYTES_PER_PARAM} bytes each), "
            f"{available / GIB:.1f} GiB is available",
            hint="pass a smaller --params, e.g. --params 500M",
        )


def row_ranks(row: dict[str, Any]) -> int:
    """The ranks a row stepped at once (a sweep before --ranks: one)."""
    return int(row.get("ranks") or 1)


def best_row(rows: Sequence[dict[str, Any]], ranks: int | None = None) -> dict[str, Any] | None:
    """The thread count with the shortest median step, among those that ran (with *ranks*
    ranks at once: the fewest the sweep timed where None)."""
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        return None
    want = min(map(row_ranks, ok)) if ranks is None else ranks
    mine = [r for r in ok if row_ranks(r) == want]
    return min(mine, key=lambda r: r["step_ms_median"]) if mine else None


def failure(rows: Sequence[dict[str, Any]]) -> IotuneError | None:
    """The error the sweep ends with when no row succeeded (None: one did)."""
    if best_row(rows) is not None:
        return None
    return IotuneError("no thread count succeeded", hint="--debug shows the workers' errors")


def threads_doc(
    rows: list[dict[str, Any]], n: int, run_dir: Path, memory: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The sweep's record (RUN/threads.json): its rows, the best thread count (the fewest
    ranks') and each rank count's, the memory probe."""
    best = best_row(rows)
    return {
        "params": n,
        "rows": rows,
        "best_threads": best["threads"] if best else None,
        "best_threads_by_ranks": {
            str(r): b["threads"]
            for r in sorted({row_ranks(x) for x in rows})
            if (b := best_row(rows, r)) is not None
        },
        "cpus": len(os.sched_getaffinity(0)),
        "memory": memory,
        "out": str(run_dir),
    }
