"""The report's tables as rows of (column, text): the study's table per model size, the
prediction against the measurement, the sweeps' best points and the thread sweep. Pure."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

from iotune.model.presets import load_presets
from iotune.report.load import AioSweep
from iotune.units import binary_size, scale_for

Table = tuple[list[str], list[list[str]]]  # header, rows


def strategy_order() -> list[str]:
    order: list[str] = []
    for p in load_presets().values():
        if p.strategy.name not in order:
            order.append(p.strategy.name)
    return order


def _size_key(size: str | None) -> tuple[int, float, str]:
    s = size or ""
    try:
        return (0, float(s.rstrip("bB")), s)
    except ValueError:
        return (1, 0.0, s)


def _run_key(r: dict[str, Any]) -> str:
    d = r.get("run_dir")
    return os.path.realpath(d) if d else str(r.get("run") or r["preset"])


def sorted_runs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """By size, then strategy in the presets file's order, then accumulation; a run
    recorded twice (a study and its run directory) keeps its last record, and runs of the
    same preset in directories of their own (other writers, other volumes) each their own."""
    order = {s: i for i, s in enumerate(strategy_order())}
    last = {_run_key(r): r for r in runs}
    return sorted(
        last.values(),
        key=lambda r: (
            _size_key(r.get("size")),
            order.get(r.get("strategy") or "", 99),
            r["ga"],
            volume_members(r),
        ),
    )


def volume_members(r: dict[str, Any]) -> int:
    """The drives behind a run's volume (0: no --volume axis)."""
    v = r.get("volume") or {}
    return int(v.get("members") or len(v.get("drives") or ()))


def volume_label(r: dict[str, Any]) -> str | None:
    """'raid0x4 (raid0, 4 drives)' for a run of a study over volumes, else None."""
    v = r.get("volume")
    if not v:
        return None
    k = volume_members(r)
    what = f"{v['level']}, {k} drives" if v.get("level") else f"{k} drive" + ("s" if k > 1 else "")
    return f"{v['name']} ({what})"


def sizes(runs: Sequence[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for r in sorted_runs(runs):
        if r.get("size") not in out:
            out.append(r.get("size") or "?")
    return out


def num(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return f"{float(v):.{digits}f}"


def _pair(m: Any, e: Any) -> str:
    if m is None and not e:
        return "-"
    return f"{num(m)} ({num(e)})"


def share(r: dict[str, Any]) -> float | None:
    """The optimizer's share of the step, 0-1."""
    m = r.get("measured") or {}
    if not m.get("step_s") or m.get("optimizer_s") is None:
        return None
    return float(m["optimizer_s"]) / float(m["step_s"])


def predicted(r: dict[str, Any], key: str) -> float | None:
    p = r.get("prediction") or {}
    v = p.get(key)
    return None if v is None else float(v)


RUN_HEADER = [
    "Strategy",
    "GA",
    "Status",
    "Step s",
    "Optimizer s",
    "Optimizer share",
    "NVMe GiB (est.)",
    "Read GiB/step (est.)",
    "Write GiB/step (est.)",
    "R focus",
    "W focus",
    "R other",
    "W other",
    "Peak RSS GiB (est.)",
]


def size_table(runs: Sequence[dict[str, Any]], size: str) -> Table:
    """The study's table for one size: one row per strategy x accumulation, measured beside
    the estimate, and the study's published row where there is one."""
    rows = []
    studied: dict[str, dict[str, Any]] = {}
    for r in sorted_runs(runs):
        if (r.get("size") or "?") != size:
            continue
        m, e = r.get("measured") or {}, r.get("estimate") or {}
        sh = share(r)
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('error') or ''}"
        label = volume_label(r)
        rows.append(
            [
                (r.get("strategy") or r["preset"]) + (f" on {label}" if label else ""),
                str(r["ga"]),
                status,
                num(m.get("step_s")),
                num(m.get("optimizer_s")),
                "-" if sh is None else f"{sh:.0%}",
                _pair(m.get("nvme_gib"), e.get("nvme_gib")),
                _pair(m.get("read_gib"), e.get("read_gib")),
                _pair(m.get("write_gib"), e.get("write_gib")),
                num(m.get("read_focus")),
                num(m.get("write_focus")),
                num(m.get("read_other")),
                num(m.get("write_other")),
                _pair(m.get("peak_rss_gib"), e.get("host_gib")),
            ]
        )
        if r.get("study"):
            studied[r["study"]["case"]] = r["study"]
    for case, st in studied.items():
        sh = (
            st["optimizer_s"] / st["step_s"] if st.get("step_s") and st.get("optimizer_s") else None
        )
        rows.append(
            [
                f"the study: {case}",
                "1",
                "published",
                num(st.get("step_s")),
                num(st.get("optimizer_s")),
                "-" if sh is None else f"{sh:.0%}",
                num(st.get("space_gib")),
                num(st.get("read_gib")),
                num(st.get("write_gib")),
                num(st.get("read_focus")),
                num(st.get("write_focus")),
                num(st.get("read_other")),
                num(st.get("write_other")),
                "-",
            ]
        )
    return RUN_HEADER, rows


PREDICTION_HEADER = [
    "Run",
    "Optimizer s, predicted",
    "Optimizer s, measured",
    "Error",
    "Step s, predicted",
    "Step s, measured",
    "Error",
    "From",
]


def _err(p: float | None, m: float | None) -> str:
    return "-" if p is None or not m else f"{p / m - 1:+.1%}"


def prediction_table(runs: Sequence[dict[str, Any]]) -> Table:
    rows = []
    for r in sorted_runs(runs):
        pred = r.get("prediction") or {}
        if pred.get("optimizer_s") is None:
            continue
        m = r.get("measured") or {}
        po, ps = predicted(r, "optimizer_s"), predicted(r, "step_s")
        rows.append(
            [
                r.get("run") or r["preset"],
                num(po),
                num(m.get("optimizer_s")),
                _err(po, m.get("optimizer_s")),
                num(ps),
                num(m.get("step_s")),
                _err(ps, m.get("step_s")),
                "; ".join(f"{t['what']} {t['seconds']:.2f} s" for t in pred.get("terms", [])),
            ]
        )
    return PREDICTION_HEADER, rows


def fio_best(sweep: AioSweep, op: str) -> float | None:
    vals = [float(c["bw_bytes_s"]) for c in sweep.ceilings if c.get("op") == op]
    return max(vals) if vals else None


def sweep_table(sweep: AioSweep) -> Table:
    """Best point per op, against fio's best over the same grid."""
    every = [float(r["bw_bytes_s"]) for r in [*sweep.records, *sweep.ceilings] if r.get("op")]
    unit, scale = scale_for(max(every, default=0.0))
    header = ["Op", "Block", "QD", "Threads", f"{unit}/s", f"fio best {unit}/s", "% of fio best"]
    rows = []
    for op in ("read", "write"):
        mine = [r for r in sweep.records if r.get("op") == op]
        if not mine:
            continue
        b = max(mine, key=lambda r: r["bw_bytes_s"])
        f = fio_best(sweep, op)
        rows.append(
            [
                op,
                binary_size(b["block_size"]),
                str(b["queue_depth"]),
                str(b["threads"]),
                f"{b['bw_bytes_s'] / scale:.2f}",
                "-" if f is None else f"{f / scale:.2f}",
                "-" if f is None else f"{b['bw_bytes_s'] / f:.0%}",
            ]
        )
    return header, rows


def threads_table(doc: dict[str, Any]) -> Table:
    header = ["Threads", "Optimizer step ms (median)", "ms per 1e9 parameters"]
    rows = []
    for r in doc["rows"]:
        if r.get("status") != "ok":
            rows.append([str(r["threads"]), f"failed: {r.get('error', '')}", "-"])
            continue
        ms = float(r["step_ms_median"])
        rows.append([str(r["threads"]), f"{ms:.1f}", f"{ms * 1e9 / int(r['params']):.1f}"])
    return header, rows


def checkpoint_table(runs: Sequence[dict[str, Any]]) -> Table:
    """One row per run that saved: the writer, the volumes, a save's seconds and bytes beside
    the I/O model's, and the parity's amplification on a protected array. Empty: none did."""
    header = [
        "Run",
        "Writer",
        "Saves",
        "Blocked s",
        "Durable s",
        "GiB a save (model)",
        "Read offload GiB",
        "Write checkpoint GiB",
        "Checkpoint volume",
        "Parity x (full stripes)",
    ]
    rows = []
    for r in sorted_runs(runs):
        ck = r.get("checkpoints")
        if not ck:
            continue
        model = ck.get("estimate") or {}
        est = model.get("bytes", model.get("write_bytes"))  # a save's size on disk
        amp = ck.get("amplification")
        rows.append(
            [
                _run_label(r),
                str(ck["writer"]),
                str(ck["saves"]),
                num(ck.get("blocked_s")),
                num(ck.get("durable_s")),
                _pair(_gib(ck.get("bytes")), _gib(est)),
                num(_gib(ck.get("offload_read_bytes")), 3),
                num(_gib(ck.get("checkpoint_write_bytes")), 3),
                _volume_cell(ck.get("level"), ck.get("checkpoint_drives"), "-"),
                "-"
                if amp is None
                else _parity_cell(ck)
                + (", read-modify-write" if ck.get("read_modify_write") else ""),
            ]
        )
    return header, rows


def _run_label(r: dict[str, Any]) -> str:
    label = volume_label(r)
    return str(r.get("strategy") or r["preset"]) + (f" on {label}" if label else "")


def _volume_cell(level: str | None, drives: list[str] | None, none: str) -> str:
    """'raid6 of a, b, c, d', the drives alone off an array, *none* where none was traced."""
    return (f"{level} of " if level else "") + ", ".join(drives or [none])


def _parity_cell(rec: dict[str, Any]) -> str:
    """The members' writes against the bytes, beside full stripes' ideal: '2.010 (2.000)'."""
    return f"{rec['amplification']:.3f} ({rec['ideal']:.3f})"


def _gib(b: float | None) -> float | None:
    return None if b is None else b / 2**30


def persist_table(runs: Sequence[dict[str, Any]]) -> Table:
    """One row per run whose saves were persisted (--checkpoint-persist): where to, how long
    until each was durable and how long the training waited for it, its bytes and what the
    persist volume's drives wrote, with the parity's amplification on a protected array.
    Empty: none was."""
    header = [
        "Run",
        "Persisted to",
        "Persists",
        "Durable after s",
        "Waited s",
        "GiB a persist",
        "Written GiB",
        "Persist volume",
        "Parity x (full stripes)",
    ]
    rows = []
    for r in sorted_runs(runs):
        p = (r.get("checkpoints") or {}).get("persist")
        if not p:
            continue
        rows.append(
            [
                _run_label(r),
                str(p.get("dir")),
                str(p["persists"]),
                num(p.get("seconds")),
                num(p.get("waited_s")),
                num(_gib(p.get("bytes")), 3),
                num(_gib(p.get("write_bytes")), 3),
                _volume_cell(p.get("level"), p.get("drives"), "not traced"),
                "-" if p.get("amplification") is None else _parity_cell(p),
            ]
        )
    return header, rows
