"""`iotune sweep-threads`: DeepSpeedCPUAdam step time per OpenMP thread count."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from iotune import proc
from iotune.errors import CommandFailed, UsageError
from iotune.workers import worker_env

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}


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
            done = proc.run(
                [sys.executable, "-m", "iotune.workers.adam_step", str(n), str(repeats)],
                env={**worker_env(), "OMP_NUM_THREADS": str(t)},
                timeout=1800,
            )
            row.update(proc.worker_json(done))
            row["status"] = "ok"
        except CommandFailed as exc:
            row["status"] = "failed"
            row["error"] = (
                exc.stderr_tail.strip().splitlines()[-1]
                if exc.stderr_tail.strip()
                else str(exc.returncode)
            )
        rows.append(row)
        if on_row:
            on_row(row)
    return rows
