"""Screen rendering for the sweeps: progress while points run, every point's row, the picks,
the thread sweep's table."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from iotune.render import err_console
from iotune.units import amount, format_size, scale_for

if TYPE_CHECKING:
    from iotune.sweep.runner import Sweep

#: columns a sweep's records may lack (no point succeeded, or no fio ceiling)
_NUMERIC = ("pct_of_fio", "bw_bytes_s", "bw_min", "bw_max", "block_interval_us", "cpu_cores")


def run_with_progress(sweep: Sweep, *, quiet: bool) -> tuple[list[dict[str, Any]], bool]:
    """Run the sweep under a progress bar on stderr; Ctrl-C keeps the finished points."""
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        transient=True,
        console=err_console(),
        disable=quiet,
    )
    with progress:
        task = progress.add_task("sweep", total=sweep.expected(), completed=len(sweep.records))

        def on_point(rec: dict[str, Any], n: int, total: int) -> None:
            bw = amount(rec["bw_bytes_s"], "/s") if rec.get("status") == "ok" else rec.get("status")
            progress.update(
                task,
                completed=n,
                total=max(total, n),
                description=f"{rec['op']} {format_size(rec['block_size'])} qd{rec['queue_depth']} t{rec['threads']}: {bw}",
            )

        sweep.on_point = on_point
        try:
            return sweep.run(), False
        except KeyboardInterrupt:
            return list(sweep.records.values()), True


def phase_label(r: Any) -> str:
    """A point's phase, with the race's round for a finalist ("final 2"); records from
    before rounds, and DataFrame rows without one (NaN), show the phase alone."""
    n = r.get("round")
    return (
        f"{r['phase']} {int(n)}"
        if isinstance(n, (int, float)) and not math.isnan(n) and n
        else str(r["phase"])
    )


def _latency_cells(lat: Any) -> list[str]:
    """p50 and p99 of the point's requests at its drives (µs), and the requests in flight at
    a drive, time-weighted: "-" where the point has none."""
    if not isinstance(lat, dict):
        return ["-", "-", "-"]
    flight = lat.get("in_flight_per_drive")
    return [
        f"{lat['p50_us']:,.0f}",
        f"{lat['p99_us']:,.0f}",
        "-" if flight is None else f"{flight:.1f}",
    ]


def sweep_table(df: Any) -> Table:
    """Every point, one row each (a DataFrame sorted by the caller)."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    unit, scale = scale_for(float(df["bw_bytes_s"].max()) if len(df) else 0.0)
    for col in (
        "OP",
        "BLOCK",
        "QD",
        "THREADS",
        "SINGLE",
        "OVERLAP",
        "PHASE",
        f"{unit}/s",
        f"SPREAD {unit}/s",
        "% FIO",
        "US/BLOCK",
        "CPU CORES",
        "LAT p50 µs",
        "LAT p99 µs",
        "IN FLIGHT",
        "STATUS",
    ):
        table.add_column(col, justify="left" if col in ("OP", "PHASE", "STATUS") else "right")
    for _, r in df.iterrows():
        ok = r["status"] == "ok"
        table.add_row(
            r["op"],
            format_size(int(r["block_size"])),
            str(r["queue_depth"]),
            str(r["threads"]),
            str(bool(r["single_submit"])).lower(),
            str(bool(r["overlap_events"])).lower(),
            phase_label(r),
            f"{r['bw_bytes_s'] / scale:.2f}" if ok else "-",
            f"{r['bw_min'] / scale:.2f}-{r['bw_max'] / scale:.2f}" if ok else "-",
            f"{r['pct_of_fio']:.0f}%"
            if ok and r.get("pct_of_fio") == r.get("pct_of_fio") and r.get("pct_of_fio") is not None
            else "-",
            f"{r['block_interval_us']:.0f}" if ok else "-",
            f"{r['cpu_cores']:.2f}" if ok else "-",
            *_latency_cells(r.get("latency") if ok else None),
            "ok" if ok else f"{r['status']}: {str(r.get('error', ''))[:60]}",
        )
    return table


def print_result(
    con: Console,
    records: Sequence[dict[str, Any]],
    result: dict[str, Any],
    run_dir: Path,
    write_config: str | None,
) -> None:
    """The points by bandwidth, the best per op, the balanced pick and the aio block."""
    if records:
        import pandas as pd

        df = pd.DataFrame(records)
        for col in _NUMERIC:
            if col not in df:
                df[col] = float("nan")
        df = df.sort_values(["op", "bw_bytes_s"], ascending=[True, False], na_position="last")
        con.print(sweep_table(df))
        con.print()
    for op, r in result["best"].items():
        pct = f", {r['pct_of_fio']:.0f}% of fio" if r.get("pct_of_fio") else ""
        n = r.get("measurements")
        pct += f", median of {n} measurements" if n else ""
        con.print(
            f"best {op}: {amount(r['bw_bytes_s'], '/s')} ({r['bw_bytes_s'] / 1e9:.3g} GB/s{pct}) with "
            f"block {format_size(r['block_size'])}, queue depth {r['queue_depth']}, {r['threads']} thread(s), "
            f"single_submit {str(r['single_submit']).lower()}, overlap_events {str(r['overlap_events']).lower()}"
        )
    for op, f in (result.get("fio_best") or {}).items():
        con.print(
            f"fio's best {op} over the same grid: {amount(f['bw_bytes_s'], '/s')} "
            f"(block {format_size(f['block_size'])}, queue depth {f['queue_depth']}, "
            f"{f['jobs']} job(s)); the best AIO {op} is {f['aio_pct']:.0f}% of it"
        )
    bal = result["balanced"]
    if bal:
        con.print(
            f"best balanced (geometric mean of read and write vs their bests: {bal['score']:.2f}): "
            f"{json.dumps(bal['config'])}"
        )
    if result["aio"]:
        con.print('\nDeepSpeed config:\n"aio": ' + json.dumps(result["aio"], indent=2))
    for h in result["nvme_path_hints"]:
        con.print(h)
    if "config_written" in result:
        con.print(
            f"merged into {write_config} (DeepSpeed reads: {json.dumps(result['config_written']['deepspeed_reads'])})"
        )
    swap = result.get("swap")
    if swap:
        con.print(swap_line(swap))
    con.print(f"records: {run_dir}/points.jsonl ({result['ok']} ok, {result['failed']} failed)")


def swap_line(r: dict[str, Any]) -> str:
    """One line for a swap rehearsal's record."""
    name = " ".join([r["preset"], *(f"--set {x}" for x in r.get("sets", []))])
    head = (
        f"{name}'s optimizer swapping at block {format_size(r['block_size'])}, queue "
        f"depth {r['queue_depth']}, {r['threads']} thread(s)"
    )
    if r.get("status") != "ok":
        return f"{head}: {r.get('status')}: {r.get('error', '')}"
    return (
        f"{head}: read {amount(r['read_bytes'])} at {amount(r['read_bw_bytes_s'], '/s')}, "
        f"write {amount(r['write_bytes'])} at {amount(r['write_bw_bytes_s'], '/s')} "
        f"({r['files']} files, median of {len(r['rounds'])} round(s))"
    )


def threads_table(rows: Sequence[dict[str, Any]]) -> Table:
    """One row per rank count and thread count: median, min and max optimizer-step time
    (with several ranks at once: each rank's share, a step as long as its slowest rank)."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("RANKS", "THREADS", "PARAMS A RANK", "STEP MS (MEDIAN)", "MIN", "MAX", "STATUS"):
        table.add_column(col, justify="right" if col != "STATUS" else "left")
    for r in rows:
        good = r["status"] == "ok"
        table.add_row(
            str(r.get("ranks") or 1),
            str(r["threads"]),
            f"{r['params']:,}",
            f"{r['step_ms_median']:.1f}" if good else "-",
            f"{r['step_ms_min']:.1f}" if good else "-",
            f"{r['step_ms_max']:.1f}" if good else "-",
            "ok" if good else f"{r['status']}: {r.get('error', '')[:60]}",
        )
    return table


def best_lines(rows: Sequence[dict[str, Any]], n: int, by_ranks: dict[str, int]) -> list[str]:
    """Each rank count's best thread count, in a line."""
    from iotune.sweep.threads import best_row

    out = []
    for r in sorted(by_ranks, key=int):
        best = best_row(rows, int(r))
        if best is None:
            continue
        each = f"each of {r} ranks' {best['params']:,}" if int(r) > 1 else f"{n:,}"
        out.append(
            f"best: {best['threads']} thread(s), {best['step_ms_median']:.1f} ms per optimizer "
            f"step for {each} parameters"
        )
    return out


def memory_line(probe: dict[str, Any]) -> str:
    """The memory probe in a line: the best triad and copy, and at what thread count."""
    if "error" in probe:
        return f"memory bandwidth: not measured ({probe['error']})"
    rows = probe["rows"]
    triad = max(rows, key=lambda r: r["triad_bytes_s"])
    copy = max(rows, key=lambda r: r["copy_bytes_s"])
    return (
        f"memory bandwidth (STREAM's count, {probe['elements'] * 4 / 2**20:.0f} MiB arrays): "
        f"triad {amount(triad['triad_bytes_s'], '/s')} at {triad['threads']} thread(s), "
        f"copy {amount(copy['copy_bytes_s'], '/s')} at {copy['threads']} thread(s)"
    )
