"""The sweeps' figures in the report: DeepSpeed's AIO bandwidth over block size and queue
depth (``sweep-aio``), and CPU Adam's step time over threads (``sweep-threads``) beside the
study's; drawn as iotune.report.figures draws the runs' (a :class:`Drawn` each, None when
there is nothing to draw)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from iotune.report import tables as tb
from iotune.report.figures import PALETTE, Drawn
from iotune.report.load import AioSweep
from iotune.units import binary_size, scale_for


def sweep_heatmap(sweep: AioSweep) -> Drawn | None:
    """(5) Bandwidth over block size x queue depth per op (the best over threads and the
    submit flags), annotated, with fio's best over the same grid in the title."""
    if not sweep.records:
        return None
    ops = [o for o in ("read", "write") if any(r["op"] == o for r in sweep.records)]
    fig, axes = plt.subplots(1, len(ops), figsize=(5.2 * len(ops), 4.2), squeeze=False)
    unit, scale = scale_for(max(float(r["bw_bytes_s"]) for r in sweep.records))
    for ax, op in zip(axes[0], ops, strict=True):
        mine = [r for r in sweep.records if r["op"] == op]
        bss = sorted({r["block_size"] for r in mine})
        qds = sorted({r["queue_depth"] for r in mine})
        grid = [[math.nan] * len(bss) for _ in qds]
        for r in mine:
            i, j = qds.index(r["queue_depth"]), bss.index(r["block_size"])
            v = float(r["bw_bytes_s"]) / scale
            if math.isnan(grid[i][j]) or v > grid[i][j]:
                grid[i][j] = v
        im = ax.imshow(grid, origin="lower", cmap="viridis", aspect="auto")
        for i in range(len(qds)):
            for j in range(len(bss)):
                if not math.isnan(grid[i][j]):
                    ax.text(
                        j,
                        i,
                        f"{grid[i][j]:.2f}",
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if grid[i][j] < 0.6 * max(map(max, grid)) else "black",
                    )
        ax.set_xticks(range(len(bss)))
        ax.set_xticklabels([binary_size(b) for b in bss], fontsize=8)
        ax.set_yticks(range(len(qds)))
        ax.set_yticklabels([str(q) for q in qds], fontsize=8)
        ax.set_xlabel("block size")
        ax.set_ylabel("queue depth")
        f = tb.fio_best(sweep, op)
        ax.set_title(
            f"{op}, {unit}/s" + (f" (fio best {f / scale:.2f})" if f else " (no fio ceiling)"),
            fontsize=10,
        )
        fig.colorbar(im, ax=ax, label=f"{unit}/s")
    fig.suptitle(f"DeepSpeed AIO bandwidth: {sweep.name}", fontsize=10)
    fig.tight_layout()
    return Drawn(
        f"sweep_{sweep.name}",
        f"AIO sweep {sweep.name}",
        "The best bandwidth DeepSpeed's async I/O reached at each block size and queue depth "
        f"(over thread counts and submit modes) on {sweep.target or 'the target'}.",
        fig,
    )


def adam_threads(docs: Sequence[dict[str, Any]], study: dict[str, Any] | None) -> Drawn | None:
    """(6) CPU-Adam step time over threads, per 1e9 parameters (so sweeps of different sizes
    and the study's 2B figures share an axis)."""
    if not docs:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for k, doc in enumerate(docs):
        ok = [r for r in doc["rows"] if r.get("status") == "ok"]
        ax.plot(
            [r["threads"] for r in ok],
            [float(r["step_ms_median"]) * 1e9 / int(r["params"]) for r in ok],
            "o-",
            color=PALETTE[k % len(PALETTE)],
            label=f"measured, {int(doc['params']) / 1e9:.2g}e9 parameters",
            gid="measured",
        )
    if study:
        ax.plot(
            study["threads"],
            [ms * 1e9 / study["params"] for ms in study["optimizer_ms"]],
            "s--",
            color="grey",
            label="the study (its 2B model, 96 GB DDR5 workstation)",
            gid="study",
        )
    ax.set_xlabel("OpenMP threads")
    ax.set_ylabel("ms per optimizer step per 1e9 parameters")
    ax.set_title("CPU Adam step time over threads")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return Drawn(
        "adam_threads",
        "CPU Adam over threads",
        "DeepSpeedCPUAdam's step time per billion parameters: memory-bandwidth bound, so "
        "more threads stop helping once the memory channels are full.",
        fig,
    )
