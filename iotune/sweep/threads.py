"""`iotune sweep-threads`: DeepSpeedCPUAdam step time per OpenMP thread count."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
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


def run_thread_sweep(
    n: int,
    threads: Sequence[int],
    repeats: int,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    rows = []
    for t in threads:
        row: dict[str, Any] = {"threads": t, "params": n}
        try:
            row.update(
                proc.run_worker(
                    "iotune.workers.adam_step",
                    str(n),
                    str(repeats),
                    env={"OMP_NUM_THREADS": str(t)},
                    timeout=1800,
                )
            )
            row["status"] = "ok"
        except CommandFailed as exc:
            row["status"] = "failed"
            row["error"] = last_line(exc.stderr_tail) or str(exc.returncode)
        rows.append(row)
        if on_row:
            on_row(row)
    return rows


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


def best_row(rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The thread count with the shortest median step, among those that ran."""
    ok = [r for r in rows if r["status"] == "ok"]
    return min(ok, key=lambda r: r["step_ms_median"]) if ok else None


def failure(rows: Sequence[dict[str, Any]]) -> IotuneError | None:
    """The error the sweep ends with when no thread count succeeded (None: one did)."""
    if best_row(rows) is not None:
        return None
    return IotuneError("no thread count succeeded", hint="--debug shows the workers' errors")
