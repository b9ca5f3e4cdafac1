"""One run as one summary record: the figures the study's tables and figures are made of,
measured beside estimated. Pure: built from a run's run.json (and its trace.json, when the
run was traced per request)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from iotune.plan.rundoc import (
    backward_median,
    forward_backward,
    load_run,
    load_trace,
    optimizer_median,
)
from iotune.units import gib_value

#: the per-step row a run is represented by: ZenFlow's mean over one update interval when
#: the run has one (its median step hides the update), else the median steady step
_PER_STEP = ("mean of steps", "steady step")


def per_step_row(run: dict[str, Any]) -> dict[str, Any] | None:
    for prefix in _PER_STEP:
        row = next((r for r in run.get("table", []) if r["case"].startswith(prefix)), None)
        if row:
            return dict(row)
    return None


def _estimate_row(run: dict[str, Any], per: dict[str, Any] | None) -> dict[str, Any] | None:
    rows = run.get("estimate_table", [])
    if per and per["case"].startswith("mean of steps"):
        hit = next((r for r in rows if r["case"].startswith("estimate: mean")), None)
        if hit:
            return dict(hit)
    return next((dict(r) for r in rows if r["case"] == "estimate: steady step"), None)


def drives(trace: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per drive: request counts by exact size per op, and the limits that shape them."""
    out = []
    for d in (trace or {}).get("devices", []):
        out.append(
            {
                "name": d["name"],
                "max_sectors_kb": d.get("max_sectors_kb"),
                "chunk_bytes": d.get("chunk_bytes"),
                "read_sizes": {int(k): int(v) for k, v in d["read"].get("sizes", {}).items()},
                "write_sizes": {int(k): int(v) for k, v in d["write"].get("sizes", {}).items()},
            }
        )
    return out


def latency_steps(io_steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step and drive: read and write p50/p99 (µs) and the time-weighted requests in
    flight, from a run's io_steps (empty where the trace timed none). Pure."""
    out = []
    for s in io_steps:
        for drive, per in (s.get("drives") or {}).items():
            lat = per.get("latency")
            if not lat or not lat["depth"].get("timed"):
                continue
            row: dict[str, Any] = {"label": s["label"], "drive": drive}
            for op in ("read", "write"):
                st = lat.get(op) or {}
                row[f"{op}_p50_us"], row[f"{op}_p99_us"] = st.get("p50_us"), st.get("p99_us")
            row["in_flight"] = lat["depth"].get("mean")
            out.append(row)
    return out


def summarize_run(
    run: dict[str, Any], trace: dict[str, Any] | None = None, run_dir: str | None = None
) -> dict[str, Any]:
    """The study's record of one run (status ok, or failed with the worker's exit)."""
    first = next((dict(r) for r in run.get("table", []) if r["case"] == "init + first step"), None)
    per = per_step_row(run)
    est = _estimate_row(run, per)
    est_first = next(
        (dict(r) for r in run.get("estimate_table", []) if r["case"].startswith("estimate: init")),
        None,
    )
    ram = run.get("host_ram") or {}
    peak_gpu = max(
        (e.get("peak_accel_bytes") or 0 for e in run.get("events", []) if e.get("event") == "step"),
        default=0,
    )
    lost = run.get("lost_path")
    failed = bool(run.get("exit_code")) or not run.get("steps_done") or bool(lost)
    estimate = run.get("estimate") or {}
    return {
        "preset": run["preset"],
        "size": run.get("size"),
        "strategy": run.get("strategy"),
        "ga": run.get("ga", 1),
        "params": run.get("params"),
        "status": "failed" if failed else "ok",
        "error": (
            # a fabrics namespace without a path: the run was stopped, named as trace says it
            f"stopped after {run.get('steps_done', 0)} step(s): {lost}"
            if lost
            else f"the training worker exited {run.get('exit_code')} after "
            f"{run.get('steps_done', 0)} step(s)"
            + (f": {run['error']}" if run.get("error") else "")
            if failed
            else None
        ),
        "run_dir": run_dir or run.get("out"),
        "steps_done": run.get("steps_done"),
        "latency_steps": latency_steps(run.get("io_steps") or []),
        "backend": run.get("backend"),
        "focus_size": run.get("focus_size"),
        "aio": run.get("aio"),
        "per_step_case": per["case"] if per else None,
        "measured": {
            "step_s": per.get("step_s") if per else None,
            "optimizer_s": per.get("optimizer_s") if per else None,
            "forward_backward_s": forward_backward(run),
            "backward_s": backward_median(run),
            "optimizer_median_s": optimizer_median(run),
            "init_s": run.get("init_s"),
            "nvme_gib": (per or {}).get("nvme_gib"),
            "read_gib": (per or {}).get("read_gib"),
            "write_gib": (per or {}).get("write_gib"),
            "first_read_gib": (first or {}).get("read_gib"),
            "first_write_gib": (first or {}).get("write_gib"),
            "read_focus": (per or {}).get("read_focus"),
            "write_focus": (per or {}).get("write_focus"),
            "read_other": (per or {}).get("read_other"),
            "write_other": (per or {}).get("write_other"),
            "peak_rss_gib": gib_value(ram.get("measured_peak")),
            "peak_gpu_gib": gib_value(peak_gpu) if peak_gpu else None,
        },
        "estimate": {
            "nvme_gib": gib_value(estimate.get("nvme_bytes")),
            "read_gib": (est or {}).get("read_gib"),
            "write_gib": (est or {}).get("write_gib"),
            "first_read_gib": (est_first or {}).get("read_gib"),
            "first_write_gib": (est_first or {}).get("write_gib"),
            "host_gib": gib_value(estimate.get("host_bytes")),
            "gpu_gib": gib_value(estimate.get("gpu_bytes")),
        },
        "prediction": run.get("prediction"),
        "checkpoints": checkpoint_summary(run.get("checkpoints")),
        "study": run.get("study"),
        "drives": drives(trace),
        "wall_s": run.get("wall_s"),
        "interrupted": run.get("interrupted"),
    }


#: a save's figures the run's record keeps the median of
_SAVE_MEDIANS = ("blocked_s", "durable_s", "bytes", "offload_read_bytes", "checkpoint_write_bytes")


def _median_of(items: list[dict[str, Any]], key: str) -> float | None:
    vals = [x[key] for x in items if x.get(key) is not None]
    return statistics.median(vals) if vals else None


def _parity_of(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The level, the median amplification and its full-stripe ideal of the *items*' parity
    records (saves' or persists'), None each where none was on a protected array."""
    parity = [x["parity"] for x in items if x.get("parity")]
    return {
        "level": parity[0]["level"] if parity else None,
        "amplification": statistics.median(p["amplification"] for p in parity) if parity else None,
        "ideal": parity[0]["ideal"] if parity else None,
    }


def checkpoint_summary(ck: dict[str, Any] | None) -> dict[str, Any] | None:
    """A run's saves in one record: the medians of their seconds and bytes, the model's bytes
    and, on a protected array, the parity's amplification against its full-stripe ideal."""
    saves = (ck or {}).get("saves") or []
    if not ck or not saves:
        return None
    parity = [s["parity"] for s in saves if s.get("parity")]
    persists = [s["persist"] for s in saves if s.get("persist")]
    return {
        "writer": ck.get("writer"),
        "saves": len(saves),
        **{k: _median_of(saves, k) for k in _SAVE_MEDIANS},
        "estimate": ck.get("estimate"),
        "checkpoint_drives": ck.get("checkpoint_drives"),
        **_parity_of(saves),
        "read_modify_write": any(p["read_modify_write"] for p in parity) if parity else None,
        "persist": persist_summary(persists, ck.get("persist_drives")) if persists else None,
    }


def persist_summary(persists: list[dict[str, Any]], drives: list[str] | None) -> dict[str, Any]:
    """A run's persists (--checkpoint-persist) in one record: where to, the medians of their
    seconds and bytes, what the persist volume's drives wrote and, on a protected array, the
    parity's amplification beside its full-stripe ideal."""
    return {
        "dir": persists[0].get("dir"),
        "persists": len(persists),
        **{k: _median_of(persists, k) for k in ("seconds", "waited_s", "bytes", "write_bytes")},
        "drives": drives,
        **_parity_of(persists),
    }


def load_run_dir(d: Path) -> dict[str, Any]:
    """A run directory's record: run.json, with trace.json's per-size counts when present
    (both read by iotune.plan.rundoc, their one reader)."""
    return summarize_run(load_run(d), load_trace(d), str(d))


def skipped(preset: Any, reason: str, est: Any | None) -> dict[str, Any]:
    """The record of a run preflight refused (or that could not start), with the numbers."""
    return {
        "preset": preset.name,
        "size": preset.size,
        "strategy": preset.strategy.name,
        "ga": preset.ga,
        "params": preset.geometry.param_count(),
        "status": "skipped",
        "error": reason,
        "run_dir": None,
        "measured": {},
        "estimate": {
            "nvme_gib": gib_value(est.nvme_bytes),
            "read_gib": gib_value(est.steady_step.read),
            "write_gib": gib_value(est.steady_step.write),
            "host_gib": gib_value(est.host_bytes),
            "gpu_gib": gib_value(est.gpu_bytes),
        }
        if est is not None
        else {},
        "drives": [],
    }
