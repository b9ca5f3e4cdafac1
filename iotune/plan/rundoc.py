"""A run's document (``run.json``, written by :mod:`iotune.train.results`) read back: its
steps after the first, their medians, and the seconds DeepSpeed's optimizer swapper spent in
its swaps. The one reader of a run's steps: the study's records, the baselines of the
predictions and the drive planner all take their figures from here."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from iotune.errors import UsageError

#: the swap timings a step event carries (iotune.workers.train.SwapClock)
SWAP_KEYS = ("grad_out_s", "swap_in_s", "grad_flush_s", "swap_out_s")
#: the gradients' writing timed at the end of backward, where DeepSpeed does it there
BACKWARD_SWAP = "backward_grad_out_s"


def load_run(path: Path) -> dict[str, Any]:
    f = path / "run.json" if path.is_dir() else path
    try:
        doc = json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise UsageError(
            f"{path}: not an iotune run ({reason})",
            hint="name a run directory written by 'iotune run' or 'iotune trace --run'",
        ) from exc
    if not isinstance(doc, dict) or "preset" not in doc:
        raise UsageError(f"{f}: not an iotune run document", hint="name a run directory")
    return doc


def load_trace(run_dir: Path) -> dict[str, Any] | None:
    """A traced run's ``trace.json`` (the tracer's document: per-size counts, the check,
    latency), None where the run was not traced or the file cannot be read."""
    f = run_dir / "trace.json"
    try:
        doc = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def later_steps(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The step events after the first: the steady steps, as the run's table has them (the
    first carries the first update's extra work; a run of one step has none)."""
    steps = [e for e in run.get("events", []) if e.get("event") == "step"]
    return steps[1:]


def _median(vals: list[float]) -> float | None:
    return round(statistics.median(vals), 4) if vals else None


def forward_backward(run: dict[str, Any]) -> float | None:
    """Median forward + backward (all micro-steps) of the steps after the first."""
    return _median(
        [
            float(e.get("forward_s") or 0)
            + float(e.get("backward_s") or 0)
            + float(e.get("accumulate_s") or 0)
            for e in later_steps(run)
        ]
    )


def backward_median(run: dict[str, Any]) -> float | None:
    """Median backward (all micro-steps) of the steps after the first."""
    return _median(
        [float(e["backward_s"]) for e in later_steps(run) if e.get("backward_s") is not None]
    )


def optimizer_median(run: dict[str, Any]) -> float | None:
    """Median optimizer step of the steps after the first."""
    return _median(
        [float(e["optimizer_s"]) for e in later_steps(run) if e.get("optimizer_s") is not None]
    )


def swap_medians(run: dict[str, Any]) -> dict[str, float] | None:
    """Median seconds of each swap (:data:`SWAP_KEYS` inside the optimizer step,
    :data:`BACKWARD_SWAP` at the end of backward), and of the optimizer step without its
    swaps (``rest_s``: CPU Adam and the copies around it), over the steps after the first;
    None for a run whose steps do not carry them (no optimizer state on NVMe, or a run
    recorded before they were timed)."""
    steps = [e for e in later_steps(run) if all(e.get(k) is not None for k in SWAP_KEYS)]
    if not steps or not all(e.get("optimizer_s") is not None for e in steps):
        return None
    out = {
        k: float(statistics.median(float(e.get(k) or 0.0) for e in steps))
        for k in (*SWAP_KEYS, BACKWARD_SWAP)
    }
    out["rest_s"] = float(
        statistics.median(
            float(e["optimizer_s"])
            - float(e["grad_out_s"])
            - float(e["swap_in_s"])
            - float(e["swap_out_s"])
            for e in steps
        )
    )
    return out


def offload_drives(run: dict[str, Any]) -> list[str]:
    """The drives the run swapped to (an array's members). A run document written before
    ``drives`` left out the checkpoint volume's drives names them among ``drives``; its
    ``checkpoints`` record says which were the offload volume's."""
    ck = run.get("checkpoints")
    older = ck.get("offload_drives") if isinstance(ck, dict) else None
    return [str(d) for d in (older or run.get("drives") or [])]


def volume_drives(run: dict[str, Any]) -> int:
    """How many drives the run swapped to (one where it names none)."""
    return max(1, len(offload_drives(run)))
