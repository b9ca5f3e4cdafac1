"""The study's figures of its runs, drawn with matplotlib (Agg: no display needed). Each
function takes records and returns a :class:`Drawn` (None when there is nothing to draw); its
bars and cells are exactly the records' values, which the tests read back from the artists.
The sweeps' figures are in iotune.report.sweep_figures, the latency ones in
iotune.report.latency_figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from iotune.records import DRIVE_KINDS
from iotune.report import tables as tb
from iotune.units import binary_size

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: one colour per accumulation / series, readable in print and for colour-blind readers
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442"]
FOCUS = {"read": "#D55E00", "write": "#CC79A7"}


@dataclass
class Drawn:
    name: str  # file stem
    title: str
    caption: str
    fig: Figure


def ok_runs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in tb.sorted_runs(runs) if r["status"] == "ok"]


def step_time(runs: Sequence[dict[str, Any]]) -> Drawn | None:
    """(1) Step time per strategy x accumulation at each size: grouped bars like the
    study's 'Performance for 1B/3B model size'; the optimizer's part hatched; predicted
    step time as a black marker where there is a prediction."""
    ok = [r for r in ok_runs(runs) if (r.get("measured") or {}).get("step_s") is not None]
    if not ok:
        return None
    sizes = tb.sizes(ok)
    fig, axes = plt.subplots(
        1, len(sizes), figsize=(max(6.0, 4.8 * len(sizes)), 4.6), squeeze=False
    )
    all_gas = sorted({r["ga"] for r in ok})
    for ax, size in zip(axes[0], sizes, strict=True):
        mine = [r for r in ok if r.get("size") == size]
        gas = sorted({r["ga"] for r in mine})  # the colour stays the accumulation's
        width = 0.8 / len(gas)
        strategies = [s for s in tb.strategy_order() if any(r["strategy"] == s for r in mine)]
        strategies += sorted({r["strategy"] for r in mine} - set(strategies))
        for j, ga in enumerate(gas):
            xs, ys, opt, pred_x, pred_y = [], [], [], [], []
            for i, s in enumerate(strategies):
                r = next((r for r in mine if r["strategy"] == s and r["ga"] == ga), None)
                if r is None:
                    continue
                x = i + (j - (len(gas) - 1) / 2) * width
                xs.append(x)
                ys.append(float(r["measured"]["step_s"]))
                opt.append(float(r["measured"].get("optimizer_s") or 0.0))
                p = tb.predicted(r, "step_s")
                if p is not None:
                    pred_x.append(x)
                    pred_y.append(p)
            color = PALETTE[all_gas.index(ga) % len(PALETTE)]
            ax.bar(xs, ys, width, color=color, gid="step")
            ax.bar(
                xs,
                opt,
                width,
                color="none",
                edgecolor="white",
                hatch="//",
                linewidth=0,
                gid="optimizer",
            )
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(
                    f"{y:.1f}",
                    (x, y),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    xytext=(0, 2),
                    textcoords="offset points",
                )
            if pred_x:
                ax.plot(pred_x, pred_y, "D", color="black", markersize=4, label=None, gid="pred")
        ax.set_xticks(range(len(strategies)))
        ax.set_xticklabels(strategies, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("step time, s (lower is better)")
        ax.set_title(f"Performance for {size.upper()} model size")
        if any(v for v in ax.get_ylim()) and _spread(mine) > 30:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    handles: list[Any] = [
        Rectangle((0, 0), 1, 1, facecolor=PALETTE[i % len(PALETTE)]) for i in range(len(all_gas))
    ]
    labels = [f"GA {g}" for g in all_gas]
    handles.append(Rectangle((0, 0), 1, 1, facecolor="grey", hatch="//", edgecolor="white"))
    labels.append("optimizer part")
    if any(tb.predicted(r, "step_s") is not None for r in ok):
        handles.append(Line2D([], [], marker="D", color="black", linestyle=""))
        labels.append("predicted step")
    fig.legend(handles, labels, loc="upper right", fontsize=8, ncols=len(labels))
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return Drawn(
        "step_time",
        "Step time per strategy and accumulation",
        "Measured seconds per optimizer step (median of the steps after the first; ZenFlow: "
        "mean over one update interval). Hatched: the optimizer's part. Diamonds: predicted "
        "from the sweeps' bandwidth and CPU-Adam rate.",
        fig,
    )


def _spread(runs: Sequence[dict[str, Any]]) -> float:
    v = [float(r["measured"]["step_s"]) for r in runs if r["measured"].get("step_s")]
    return max(v) / min(v) if v and min(v) > 0 else 1.0


def optimizer_share(runs: Sequence[dict[str, Any]]) -> Drawn | None:
    """(2) The optimizer's share of the step, per run: 100% stacked horizontal bars."""
    ok = [r for r in ok_runs(runs) if tb.share(r) is not None]
    if not ok:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(ok) + 1.4))
    names = [r["preset"] for r in ok]
    opt = [100 * float(tb.share(r) or 0) for r in ok]
    rest = [100 - v for v in opt]
    y = list(range(len(ok)))
    ax.barh(y, opt, color=PALETTE[5], label="optimizer step", gid="optimizer")
    ax.barh(y, rest, left=opt, color=PALETTE[4], label="forward + backward + rest", gid="rest")
    for yi, v, r in zip(y, opt, ok, strict=True):
        ax.text(1, yi, f"{v:.0f}% of {r['measured']['step_s']:.2f} s", va="center", fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of the step")
    ax.set_title("The optimizer's share of the step")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=2, fontsize=8)
    fig.tight_layout()
    return Drawn(
        "optimizer_share",
        "Optimizer share of the step",
        "Optimizer step time over total step time: an offloaded step is bound by the "
        "optimizer's swapping, a RAM step by CPU Adam.",
        fig,
    )


def nvme_bytes(runs: Sequence[dict[str, Any]]) -> Drawn | None:
    """(3) NVMe bytes per step, measured beside estimated, read and write."""
    ok = [
        r
        for r in ok_runs(runs)
        if (r.get("measured") or {}).get("read_gib") is not None
        and ((r["measured"]["read_gib"] or 0) + (r["measured"]["write_gib"] or 0)) > 0
    ]
    if not ok:
        return None
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(ok) + 2), 4.4))
    series = [
        ("read, measured", "measured", "read_gib", PALETTE[0], None),
        ("read, estimated", "estimate", "read_gib", PALETTE[0], "xx"),
        ("write, measured", "measured", "write_gib", PALETTE[1], None),
        ("write, estimated", "estimate", "write_gib", PALETTE[1], "xx"),
    ]
    w = 0.2
    for j, (label, which, key, color, hatch) in enumerate(series):
        xs = [i + (j - 1.5) * w for i in range(len(ok))]
        ys = [float((r.get(which) or {}).get(key) or 0.0) for r in ok]
        ax.bar(
            xs,
            ys,
            w,
            label=label,
            color=color if hatch is None else "white",
            edgecolor=color,
            hatch=hatch,
            gid=label,
        )
    ax.set_xticks(range(len(ok)))
    ax.set_xticklabels([r["preset"] for r in ok], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("GiB per step")
    ax.set_title("NVMe bytes per step: measured vs the I/O model")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return Drawn(
        "nvme_bytes",
        "NVMe bytes per step",
        "Bytes the drives read and wrote per optimizer step (block requests, all drives) and "
        "the I/O model's estimate (16N read and 16N written with the optimizer state on NVMe).",
        fig,
    )


def _size_class(b: int) -> int:
    """Round a request size up to a power of two (the histogram's bins)."""
    return 1 << max(0, (int(b) - 1).bit_length()) if b > 0 else 0


def request_sizes(runs: Sequence[dict[str, Any]], limit: int = 6) -> Drawn | None:
    """(4) Request sizes per drive: counts by size (rounded up to a power of two), read and
    write, the focus size (the AIO block) in its own colour; the queue limit and the RAID
    chunk in the title."""
    panels = [
        (r, d)
        for r in ok_runs(runs)
        for d in r.get("drives") or []
        if d.get("read_sizes") or d.get("write_sizes")  # a diskstats run has no sizes
    ][:limit]
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.8 * len(panels)), squeeze=False)
    for ax, (r, d) in zip(axes[:, 0], panels, strict=True):
        focus = int(r.get("focus_size") or 524288)
        classes = sorted(
            {_size_class(int(s)) for op in ("read_sizes", "write_sizes") for s in d[op]}
        )
        x = list(range(len(classes)))
        for j, op in enumerate(("read", "write")):
            counts = dict.fromkeys(classes, 0)
            exact = 0
            for s, n in d[f"{op}_sizes"].items():
                if int(s) == focus:
                    exact += int(n)
                else:
                    counts[_size_class(int(s))] += int(n)
            xs = [i + (j - 0.5) * 0.4 for i in x]
            ax.bar(
                xs,
                [counts[c] for c in classes],
                0.4,
                color=PALETTE[j],
                label=f"{op}, other sizes",
                gid=f"{op}-other",
            )
            fi = classes.index(_size_class(focus)) if _size_class(focus) in classes else None
            if fi is not None:
                ax.bar(
                    [fi + (j - 0.5) * 0.4],
                    [exact],
                    0.4,
                    bottom=[counts[classes[fi]]],
                    color=FOCUS[op],
                    edgecolor="black",
                    label=f"{op}, exactly {binary_size(focus)}",
                    gid=f"{op}-focus",
                )
        ax.set_xticks(x)
        ax.set_xticklabels([binary_size(c) if c else "0" for c in classes], fontsize=7, rotation=0)
        ax.set_yscale("symlog", linthresh=10)
        ax.set_ylabel("requests")
        limits = [f"AIO block {binary_size(focus)}"]
        if d.get("max_sectors_kb"):
            limits.append(f"max_sectors_kb {d['max_sectors_kb']}")
        if d.get("chunk_bytes"):
            limits.append(f"RAID chunk {binary_size(int(d['chunk_bytes']))}")
        ax.set_title(
            f"{r.get('run') or r['preset']} on {d['name']} ({', '.join(limits)})",
            fontsize=9,
        )
        ax.legend(fontsize=7, ncols=2)
    axes[-1, 0].set_xlabel("request size (rounded up to a power of two)")
    fig.tight_layout()
    return Drawn(
        "request_sizes",
        "Request sizes per drive",
        "Block requests the drives were asked to do, by size, over the whole run. The AIO "
        "block size is counted apart; the queue limit (max_sectors_kb) and a RAID chunk "
        "split larger requests.",
        fig,
    )


def step_vs_drives(runs: Sequence[dict[str, Any]]) -> Drawn | None:
    """(6) A study over volumes: step time against the number of drives behind each volume,
    measured (filled) and predicted (hollow) per strategy, the optimizer's part dotted; the
    first volume where the step no longer waits on its drives more than on the rest (the
    prediction's terms say) is marked."""
    ok = [
        r
        for r in ok_runs(runs)
        if tb.volume_members(r) and (r.get("measured") or {}).get("step_s") is not None
    ]
    if len({tb.volume_members(r) for r in ok}) < 2:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    series = sorted({(r.get("strategy") or "", r.get("size") or "", r["ga"]) for r in ok})
    notes = []
    for i, key in enumerate(series):
        mine = sorted(
            (r for r in ok if (r.get("strategy") or "", r.get("size") or "", r["ga"]) == key),
            key=tb.volume_members,
        )
        ks = [tb.volume_members(r) for r in mine]
        label = f"{key[0]} {key[1]}" + (f" ga{key[2]}" if key[2] != 1 else "")
        colour = PALETTE[i % len(PALETTE)]
        ax.plot(
            ks,
            [r["measured"]["step_s"] for r in mine],
            "o-",
            color=colour,
            label=f"{label}, measured",
            gid=f"measured-{key[0]}",
        )
        ax.plot(
            ks,
            [r["measured"].get("optimizer_s") or 0 for r in mine],
            ":",
            color=colour,
            label=f"{label}, optimizer step",
            gid=f"optimizer-{key[0]}",
        )
        pred = [(k, tb.predicted(r, "step_s")) for k, r in zip(ks, mine, strict=True)]
        pts = [(k, v) for k, v in pred if v is not None]
        if pts:
            ax.plot(
                [k for k, _ in pts],
                [v for _, v in pts],
                "o--",
                mfc="none",
                color=colour,
                label=f"{label}, predicted",
                gid=f"predicted-{key[0]}",
            )
        bound = [(k, _drive_bound(r)) for k, r in zip(ks, mine, strict=True)]
        free = next((k for k, b in bound if b is False), None)
        if free is not None and any(b for _, b in bound):
            y = next(r["measured"]["step_s"] for r in mine if tb.volume_members(r) == free)
            ax.annotate(
                "no longer drive-bound",
                (free, y),
                xytext=(0, 18),
                textcoords="offset points",
                ha="center",
                fontsize=8,
                arrowprops={"arrowstyle": "->"},
            )
            notes.append(f"{label} stops being drive-bound at {free} drives")
    ax.set_xscale("log", base=2)
    ks_all = sorted({tb.volume_members(r) for r in ok})
    ax.set_xticks(ks_all)
    ax.set_xticklabels([str(k) for k in ks_all])
    ax.set_xlabel("drives behind the offload volume (RAID0 members)")
    ax.set_ylabel("step time, s")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return Drawn(
        "step_vs_drives",
        "Step time against the number of drives",
        "Each strategy on every volume of the study: measured step (filled), its optimizer "
        "step (dotted) and the predicted step from the volume's sweep (hollow). A step is "
        "drive-bound while it waits longer on its drives' reads and writes than on forward, "
        "backward and CPU Adam" + (": " + "; ".join(notes) if notes else "") + ".",
        fig,
    )


def _waits_on_drives(term: dict[str, Any]) -> bool:
    """A term of the drives: by its kind, or, in records made before terms had kinds, by
    its label."""
    if "kind" in term:
        return term["kind"] in DRIVE_KINDS
    return str(term["what"]).startswith(("read ", "write ", "gradients "))


def _drive_bound(r: dict[str, Any]) -> bool | None:
    """From the prediction's terms: do the swaps take at least as long as the rest?"""
    terms = (r.get("prediction") or {}).get("terms") or []
    if not terms:
        return None
    io = sum(float(t["seconds"]) for t in terms if _waits_on_drives(t))
    rest = sum(float(t["seconds"]) for t in terms) - io
    return io >= rest
