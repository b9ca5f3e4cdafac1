"""The drives' latency in the report: across a sweep's points against the requests in
flight, and per step of each run (iotune/trace/latency.py measures both)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from iotune.report import figures as fg
from iotune.report.figures import FOCUS, PALETTE, Drawn, ok_runs
from iotune.report.load import AioSweep, ReportData
from iotune.report.sweep_figures import adam_threads, sweep_heatmap
from iotune.units import binary_size


def sweep_latency(sweep: AioSweep) -> Drawn | None:
    """Per op: each point's p50 (dot) and p99 (cross) at the drives against the requests in
    flight at a drive (time-weighted), one colour per block size, the queue depth beside
    each p99: where more depth stops adding bandwidth, latency grows with it."""
    pts = [r for r in sweep.records if isinstance(r.get("latency"), dict)]
    pts = [r for r in pts if r["latency"].get("in_flight_per_drive") is not None]
    if not pts:
        return None
    ops = [o for o in ("read", "write") if any(r["op"] == o for r in pts)]
    fig, axes = plt.subplots(1, len(ops), figsize=(5.4 * len(ops), 4.2), squeeze=False)
    sizes = sorted({int(r["block_size"]) for r in pts})
    for ax, op in zip(axes[0], ops, strict=True):
        for k, bs in enumerate(sizes):
            mine = [r for r in pts if r["op"] == op and int(r["block_size"]) == bs]
            if not mine:
                continue
            colour = PALETTE[k % len(PALETTE)]
            x = [r["latency"]["in_flight_per_drive"] for r in mine]
            ax.scatter(x, [r["latency"]["p50_us"] for r in mine], color=colour, marker="o", s=18)
            ax.scatter(
                x,
                [r["latency"]["p99_us"] for r in mine],
                color=colour,
                marker="x",
                s=22,
                label=binary_size(bs),
            )
            for r, xi in zip(mine, x, strict=True):
                ax.annotate(
                    f"qd{r['queue_depth']}",
                    (xi, r["latency"]["p99_us"]),
                    fontsize=6,
                    xytext=(3, 2),
                    textcoords="offset points",
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("requests in flight at a drive (time-weighted mean)")
        ax.set_ylabel("latency at the drive, µs (o p50, x p99)")
        ax.set_title(op, fontsize=10)
        ax.legend(title="block", fontsize=7, title_fontsize=7)
    fig.suptitle(f"Latency against queue depth: {sweep.name}", fontsize=10)
    fig.tight_layout()
    return Drawn(
        f"sweep_latency_{sweep.name}",
        f"AIO sweep {sweep.name}: latency against depth",
        "Each point's requests timed at the drives (issue to completion) by the trace's eBPF "
        "programs: p50 and p99 against the requests in flight at a drive over the point "
        "(Little's law); past the depth where bandwidth stops growing, only latency does.",
        fig,
    )


def run_latency(runs: Sequence[dict[str, Any]], limit: int = 6) -> Drawn | None:
    """Per run (up to *limit*): each step's p50 (dashed) and p99 (solid) per op, of the drive
    slowest at that step."""
    mine = [r for r in ok_runs(runs) if r.get("latency_steps")][:limit]
    if not mine:
        return None
    fig, axes = plt.subplots(1, len(mine), figsize=(4.2 * len(mine), 3.6), squeeze=False)
    for ax, run in zip(axes[0], mine, strict=True):
        labels = list(dict.fromkeys(r["label"] for r in run["latency_steps"]))
        for op in ("read", "write"):
            for q, style in (("p50", "--"), ("p99", "-")):
                ys = []
                for label in labels:
                    vals = [
                        r[f"{op}_{q}_us"]
                        for r in run["latency_steps"]
                        if r["label"] == label and r.get(f"{op}_{q}_us") is not None
                    ]
                    ys.append(max(vals) if vals else float("nan"))
                ax.plot(
                    range(len(labels)), ys, style, color=FOCUS[op], marker=".", label=f"{op} {q}"
                )
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels([lb.replace("step:", "") for lb in labels], fontsize=7, rotation=45)
        ax.set_yscale("log")
        ax.set_ylabel("µs (the slowest drive)")
        ax.set_title(f"{run['preset']}", fontsize=9)
        ax.legend(fontsize=6)
    fig.suptitle("Latency at the drives per step", fontsize=10)
    fig.tight_layout()
    return Drawn(
        "run_latency",
        "Latency per step",
        "Each step's requests timed at the drives, p50 and p99 per op, of the drive slowest "
        "at that step: a step slowed by one member's tail shows here.",
        fig,
    )


def draw_all(data: ReportData, study_threads: dict[str, Any] | None) -> list[Drawn]:
    """Every figure the report's data makes (iotune/report/figures.py, sweep_figures.py and
    the latency ones above), in the report's order."""
    out = [
        fg.step_time(data.runs),
        fg.step_vs_drives(data.runs),
        fg.optimizer_share(data.runs),
        fg.nvme_bytes(data.runs),
        fg.request_sizes(data.runs),
        *[sweep_heatmap(s) for s in data.sweeps],
        adam_threads(data.threads, study_threads),
        run_latency(data.runs),
        *[sweep_latency(s) for s in data.sweeps],
    ]
    return [d for d in out if d is not None]
