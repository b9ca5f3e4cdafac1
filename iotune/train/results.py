"""After a training run: the seed study's table from what the worker and the tracer recorded
(one row per step, then initialisation + first step and a steady step, each beside the
I/O model's estimate), the ranks merged, the prediction beside the measurement, and the
run directory's run.json, result.csv and result.md."""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from iotune.model.dsconfig import DEFAULT_AIO_BLOCK
from iotune.model.estimate import Estimate, IoVolume, resumed_init_first
from iotune.model.presets import Preset
from iotune.plan.predict import predict
from iotune.records import read_records, to_jsonable
from iotune.trace.model import step_io
from iotune.train.checkpoint import resume_checks, resume_io_note, resume_note, save_rows
from iotune.train.ranks import merge_ranks, per_rank
from iotune.train.request import Prepared, RunRequest
from iotune.units import GIB

# --------------------------------------------------------------------------- the table


def _row(
    case: str, io: dict[str, Any] | None, nvme: int | None, step: dict[str, Any] | None
) -> dict[str, Any]:
    r = (io or {}).get("read", {})
    w = (io or {}).get("write", {})
    return {
        "case": case,
        # GiB, as the study's tables mean by "GB" (its 16B figures fit 16N/12N/24N only so)
        "nvme_gib": None if nvme is None else round(nvme / GIB, 4),
        "read_gib": None if io is None else round(r.get("bytes", 0) / GIB, 4),
        "write_gib": None if io is None else round(w.get("bytes", 0) / GIB, 4),
        "step_s": None if step is None else step.get("step_s"),
        "optimizer_s": None if step is None else step.get("optimizer_s"),
        "read_focus": r.get("focus_requests"),
        "write_focus": w.get("focus_requests"),
        "read_other": r.get("other_requests"),
        "write_other": w.get("other_requests"),
        "read_bytes": r.get("bytes"),
        "write_bytes": w.get("bytes"),
    }


def _combine_io(rows: list[dict[str, Any]], how: Callable[[list[int]], float]) -> dict[str, Any]:
    """Per-step I/O figures combined field by field (sum over the first row's steps, median
    over later steps); a field some step lacks (diskstats backend: no sizes) stays None."""
    out: dict[str, Any] = {}
    for op in ("read", "write"):
        acc: dict[str, Any] = {}
        for k in ("bytes", "requests", "focus_requests", "other_requests", "diskstats_bytes"):
            vals = [r[op].get(k) for r in rows]
            acc[k] = None if any(v is None for v in vals) else int(how(vals))
        out[op] = acc
    return out


def _est_io(v: IoVolume) -> dict[str, Any]:
    return {"read": {"bytes": v.read}, "write": {"bytes": v.write}}


def _study(p: Preset) -> dict[str, Any] | None:
    from iotune.model.published import study_row

    row = study_row(p)
    return asdict(row) if row else None


def _host_ram(est: Estimate, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Measured peak RSS (VmHWM, what an OOM kill sees) beside the estimate's peak."""
    peaks = [int(e["host_rss_peak_bytes"]) for e in events if e.get("host_rss_peak_bytes")]
    nows = [int(e["host_rss_bytes"]) for e in events if e.get("host_rss_bytes")]
    ready = next((e for e in events if e.get("event") == "ready"), None)
    per_rank: dict[int, int] = {}
    for e in events:
        for r in e.get("ranks", []):
            if r.get("host_rss_peak_bytes"):
                per_rank[r["rank"]] = max(per_rank.get(r["rank"], 0), r["host_rss_peak_bytes"])
    return {
        "ranks": est.ranks,
        "estimate_peak": est.host_bytes,
        "estimate_steady": est.host.steady * est.ranks if est.host else None,
        "estimate_peak_per_rank": est.host.peak if est.host else None,
        "measured_peak_per_rank": {str(k): v for k, v in sorted(per_rank.items())} or None,
        "measured_peak": max(peaks) if peaks else None,
        "measured_last": nows[-1] if nows else None,
        "measured_process": int(ready["host_rss_bytes"])
        if ready and ready.get("host_rss_bytes")
        else None,
        # a worker forked from a zygote: its RSS leaves out the imports' untouched pages
        "forked": any(e.get("forked") for e in events if e.get("event") == "ready"),
        "ratio": round(max(peaks) / est.host_bytes, 3) if peaks and est.host_bytes else None,
    }


def _update_window(steps: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The last complete update interval among the steps (ZenFlow updates at step k, 2k, ...),
    or nothing when steps run one update each."""
    if k <= 1:
        return []
    by = {int(s["step"]): s for s in steps}
    last = max((n for n in by if n % k == 0), default=0)
    window = [by.get(n) for n in range(last - k + 1, last + 1)] if last else []
    return [s for s in window if s] if all(window) else []


def _prediction(req: RunRequest, prep: Prepared, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Predicted optimizer and step time beside the measured steady step."""
    pred = predict(prep.preset, prep.est, req.bandwidth, req.adam, req.baseline)
    steady = next((r for r in rows if r["case"].startswith("steady")), None)
    measured = {
        "optimizer_s": steady["optimizer_s"] if steady else None,
        "step_s": steady["step_s"] if steady else None,
    }
    return {
        **pred.to_json(),
        "measured": measured,
        "bandwidth": asdict(req.bandwidth) if req.bandwidth else None,
        "adam": asdict(req.adam) if req.adam else None,
        "baseline": asdict(req.baseline) if req.baseline else None,
    }


def per_drive(io_steps: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each traced drive's bytes per steady step (median over the steps after the first)
    and its rate over the step's time, from the kernel's counters. Pure."""
    later = steps[1:] or steps
    by_label = {s["label"]: s for s in io_steps}
    rows = [by_label.get(f"step:{s['step']}") for s in later]
    if not rows or not all(r and r.get("drives") for r in rows):
        return []
    step_s = statistics.median(s["step_s"] for s in later)
    out = []
    for d in rows[0]["drives"]:  # type: ignore[index]
        rd = statistics.median(r["drives"][d]["read"] for r in rows)  # type: ignore[index]
        wr = statistics.median(r["drives"][d]["write"] for r in rows)  # type: ignore[index]
        out.append(
            {
                "drive": d,
                "read_bytes": int(rd),
                "write_bytes": int(wr),
                "read_gib_s": round(rd / GIB / step_s, 3) if step_s else None,
                "write_gib_s": round(wr / GIB / step_s, 3) if step_s else None,
            }
        )
    return out


def _resumed_estimate(
    est: Estimate, init: dict[str, Any] | None, prep: Prepared
) -> IoVolume | None:
    """A resumed run's initialisation + first step, modelled (iotune.model.estimate
    .resumed_init_first) from the worker's init record: how the swap files came back (its
    copy's records; none where DeepSpeed's own copytree ran), and whether the save shares
    the offload volume's file system."""
    if not init or not init.get("resumed_at") or prep.swap_dir is None or prep.resume is None:
        return None
    kinds = {str(c.get("copy")) for c in init.get("resume_copy") or []} or {"deepspeed"}
    if len(kinds) != 1 or not init.get("adam_restored"):
        return None  # no Adam state in the save: its first step is a fresh start's
    try:
        same = os.stat(prep.resume[0]).st_dev == os.stat(prep.swap_dir).st_dev
    except OSError:
        return None  # another node's folders
    return resumed_init_first(est, kinds.pop(), same)


def build_result(
    req: RunRequest, prep: Prepared, trace: dict[str, Any] | None, started: float
) -> dict[str, Any]:
    out = req.out
    every = list(read_records(out / "steps.jsonl")) if (out / "steps.jsonl").exists() else []
    # what stopped a failed worker (rank N: its exception), for the record and the message
    errors = [
        f"rank {e['rank']}: {e['error']}" if e.get("rank") else e["error"]
        for e in every
        if e.get("event") == "error"
    ]
    every = merge_ranks(every)
    # the table's rows: initialisation and the optimizer steps ("ready" only marks where the
    # training's own I/O starts)
    events = [e for e in every if "step" in e]
    ready = next((e for e in every if e.get("event") == "ready"), None)
    steps = [e for e in events if e.get("event") == "step"]
    nan = [e["step"] for e in steps if isinstance(e.get("loss"), float) and math.isnan(e["loss"])]
    if nan:
        req.notes.append(
            f"the loss was NaN at step(s) {', '.join(map(str, nan))}: DeepSpeed skips the "
            "optimizer step where the gradients overflow, so those steps move less than the "
            "I/O model's bytes"
        )
    init = next((e for e in events if e.get("event") == "init"), None)
    check = resume_checks(every)
    if check is not None:
        req.notes.append(resume_note(check))
    # the table's rows: the offload volume's drives, where checkpoint or persist volumes are
    # traced beside them (their writes are the saves' and persists' rows)
    io_by_label = {s["label"]: step_io(s) for s in (trace or {}).get("steps", [])}
    traced = bool(prep.targets.disks) and trace is not None
    footprint = max((e.get("swap", {}).get("allocated", 0) for e in events), default=0)
    nvme = footprint if prep.swap_dir else None
    rows = []
    first_io = None
    if init and steps and traced and "init:0" in io_by_label and "step:1" in io_by_label:
        first_io = _combine_io([io_by_label["init:0"], io_by_label["step:1"]], sum)
    if steps:
        rows.append(_row("init + first step", first_io, nvme, steps[0]))
    later = steps[1:]
    if later:
        later_io = [
            io_by_label[f"step:{s['step']}"] for s in later if f"step:{s['step']}" in io_by_label
        ]
        med_step = {
            "step_s": round(statistics.median(s["step_s"] for s in later), 4),
            "optimizer_s": round(statistics.median(s["optimizer_s"] for s in later), 4),
        }
        rows.append(
            _row(
                f"steady step (median of {len(later)})",
                _combine_io(later_io, statistics.median)
                if traced and len(later_io) == len(later)
                else None,
                nvme,
                med_step,
            )
        )
    est = prep.est
    resumed_est = _resumed_estimate(est, init, prep)
    if resumed_est is not None:
        req.notes.append(
            "resumed: the estimate's initialisation + first step is a resume's (the save's "
            "swap files copied back, DeepSpeed's reload of the fp32 master, Adam's moments read "
            "back at the first step)"
        )
    elif init and init.get("resumed_at") and est.swapped.n_s:
        # (an optimizer in RAM has no swap files to copy back: DeepSpeed loads its state)
        req.notes.append(resume_io_note(init.get("resume_copy") or []))
    est_rows = [
        _row(
            "estimate: init + first step",
            _est_io(est.init_first if resumed_est is None else resumed_est),
            est.nvme_bytes,
            None,
        ),
        _row("estimate: steady step", _est_io(est.steady_step), est.nvme_bytes, None),
    ]
    k = est.update_interval
    window = _update_window(steps, k)
    if window:
        # ZenFlow: the median step hides the update step; the mean over one interval does not
        first_interval = window[-1]["step"] == k
        w_io = [io_by_label.get(f"step:{s['step']}") for s in window]
        mean_step = {
            "step_s": round(statistics.mean(s["step_s"] for s in window), 4),
            "optimizer_s": round(statistics.mean(s["optimizer_s"] for s in window), 4),
        }
        rows.append(
            _row(
                f"mean of steps {window[0]['step']}-{window[-1]['step']} (one update interval)",
                _combine_io([x for x in w_io if x], statistics.mean)
                if traced and all(w_io)
                else None,
                nvme,
                mean_step,
            )
        )
        mean_est = est.interval_mean(first_interval)
        if mean_est is not None:
            est_rows.append(
                _row(
                    f"estimate: mean of {'the first' if first_interval else 'an'} update interval",
                    _est_io(mean_est),
                    est.nvme_bytes,
                    None,
                )
            )
    p = prep.preset
    prediction = _prediction(req, prep, rows)
    checks = []
    for d in (trace or {}).get("devices", []):
        if d.get("check"):
            checks.append({"device": d["name"], **d["check"]})
    return {
        "preset": p.name,
        "strategy": p.strategy.name,
        "size": p.size,
        "params": p.geometry.param_count(),
        "geometry": p.geometry.model_config(),
        "ga": p.ga,
        "micro_batch": p.micro_batch,
        "seq_len": p.seq_len,
        "steps_requested": p.steps,
        "steps_done": len(steps),
        "accelerator": p.accelerator,
        "dtype": to_jsonable(asdict(prep.dtype)) if prep.dtype else None,
        "torch_cpu": ready.get("cpu") if ready else None,
        "nvme_path": str(prep.nvme_path) if prep.nvme_path else None,
        "swap_dir": str(prep.swap_dir) if prep.swap_dir else None,
        "nvme_paths": [str(x) for x in prep.nvme_paths],
        "swap_dirs": [str(x) for x in prep.swap_dirs],
        "placement": prep.placement if len(prep.nvme_paths) > 1 else None,
        "ranks": p.ranks,
        "nodes": p.nodes,
        "world": p.world,
        "node": req.launch.node if req.launch else None,
        "per_rank": per_rank(steps),
        "per_drive": per_drive((trace or {}).get("steps", []), steps),
        # the drives the run swapped to: the checkpoint volume's are traced too, and named
        # under "checkpoints", but a drives plan divides the swaps' bandwidth by these
        "drives": list(prep.offload_drives),
        "aio": prep.cfg.get("aio"),
        "aio_source": req.aio_source,
        "backend": req.backend if prep.targets.disks else None,
        "focus_size": req.focus
        or int(prep.cfg.get("aio", {}).get("block_size", DEFAULT_AIO_BLOCK)),
        "init_s": init.get("init_s") if init else None,
        "footprint": {"allocated": footprint, "estimate": est.nvme_bytes}
        if prep.swap_dir
        else None,
        "table": rows,
        "estimate_table": est_rows,
        "checkpoints": save_rows(
            every,  # the saves, and their persists
            (trace or {}).get("steps", []),
            est,
            p.strategy.optimizer == "nvme",
            prep.offload_drives if traced else (),
            prep.checkpoint_drives if traced else (),
            prep.checkpoint_array if traced else None,
            # the fast writers write the aio block's requests; torch.save goes through the
            # page cache, whose writeback sizes its own
            int(prep.cfg.get("aio", {}).get("block_size", DEFAULT_AIO_BLOCK))
            if req.checkpoint is not None and req.checkpoint.writer != "torch"
            else None,
            prep.persist_drives if traced else (),
            prep.persist_array if traced else None,
            # the persist's aio copy writes the run's aio block
            int(prep.cfg.get("aio", {}).get("block_size", DEFAULT_AIO_BLOCK)),
        ),
        "resumed_at": init.get("resumed_at") if init else None,
        "resume_check": check,
        "estimate": to_jsonable(asdict(est)),
        "resources": to_jsonable(asdict(prep.res)),
        "events": events,
        "import_s": ready.get("import_s") if ready else None,
        "study": _study(p),
        "prediction": prediction,
        "host_ram": _host_ram(est, [*([ready] if ready else []), *events]),
        "io_steps": (trace or {}).get("steps", []),
        # each drive's latency and depth over the whole trace, histograms included
        "latency": {
            d["name"]: d["latency"] for d in (trace or {}).get("devices", []) if d.get("latency")
        },
        "diskstats_check": checks,
        "dropped": (trace or {}).get("dropped"),
        "bpf_time": (trace or {}).get("bpf_time"),
        "tracer_cpu_s": (trace or {}).get("tracer_cpu_s"),
        "other_io": (trace or {}).get("other_io"),
        "notes": req.notes,
        "interrupted": (trace or {}).get("interrupted", "SIGINT" if trace is None else None),
        "lost_path": (trace or {}).get("lost_path"),
        "exit_code": (trace or {}).get("exit_code"),
        "error": "; ".join(errors) or None,
        "wall_s": round(time.time() - started, 2),
        "out": str(out),
    }


COLUMNS = (
    ("case", "Case"),
    ("nvme_gib", "Space on NVMe, GiB"),
    ("read_gib", "Read, GiB"),
    ("write_gib", "Write, GiB"),
    ("step_s", "Total step time, s"),
    ("optimizer_s", "Optimizer step time, s"),
    ("read_focus", "R, {f}"),
    ("write_focus", "W, {f}"),
    ("read_other", "R, Other"),
    ("write_other", "W, Other"),
)


def write_result(out: Path, result: dict[str, Any]) -> None:
    from iotune.units import binary_size

    tmp = out / "run.json.tmp"
    tmp.write_text(json.dumps(to_jsonable(result), indent=2) + "\n")
    tmp.replace(out / "run.json")
    f = binary_size(result["focus_size"])
    heads = [h.format(f=f) for _, h in COLUMNS]
    rows = [
        {**r, "case": f"{result['preset']}: {r['case']}"}
        for r in result["table"] + result["estimate_table"]
    ]
    with (out / "result.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(heads)
        for r in rows:
            w.writerow(["" if r[k] is None else r[k] for k, _ in COLUMNS])
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        lines.append(
            "| " + " | ".join("" if r[k] is None else str(r[k]) for k, _ in COLUMNS) + " |"
        )
    (out / "result.md").write_text(
        "GiB = 2^30 bytes (the study's tables say GB and mean GiB); request counts are block "
        "requests issued to the drives.\n\n" + "\n".join(lines) + "\n"
    )
