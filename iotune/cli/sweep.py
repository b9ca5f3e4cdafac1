"""`iotune sweep-aio` and `iotune sweep-threads`: DeepSpeed async I/O and CPU optimizer sweeps."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from iotune import doctor
from iotune.cli.options import (
    STATE,
    _bool,
    _list,
    _posint,
    json_option,
)
from iotune.errors import IotuneError, NotRootError, UsageError
from iotune.probes.sysfs import SysTree
from iotune.records import to_jsonable
from iotune.render import console, emit_json, err_console
from iotune.units import format_size


def _sweep_table(df: Any) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in (
        "OP",
        "BLOCK",
        "QD",
        "THREADS",
        "SINGLE",
        "OVERLAP",
        "PHASE",
        "GiB/s",
        "SPREAD GiB/s",
        "% FIO",
        "US/BLOCK",
        "CPU CORES",
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
            r["phase"],
            f"{r['bw_bytes_s'] / 2**30:.2f}" if ok else "-",
            f"{r['bw_min'] / 2**30:.2f}-{r['bw_max'] / 2**30:.2f}" if ok else "-",
            f"{r['pct_of_fio']:.0f}%"
            if ok and r.get("pct_of_fio") == r.get("pct_of_fio") and r.get("pct_of_fio") is not None
            else "-",
            f"{r['block_interval_us']:.0f}" if ok else "-",
            f"{r['cpu_cores']:.2f}" if ok else "-",
            "ok" if ok else f"{r['status']}: {str(r.get('error', ''))[:60]}",
        )
    return table


@click.command("sweep-aio")
@click.option(
    "--target",
    type=click.Path(),
    help="Directory on the volume to test (O_DIRECT files are written there).",
)
@click.option("--block-size", default="128K,256K,512K,1M,2M,4M,8M", show_default=True)
@click.option("--queue-depth", default="4,8,16,32,64,128", show_default=True)
@click.option(
    "--threads", default="1,2,4,8", show_default=True, help="DeepSpeed intra_op_parallelism."
)
@click.option("--single-submit", default="false,true", show_default=True)
@click.option("--overlap-events", default="false,true", show_default=True)
@click.option("--ops", default="read,write", show_default=True)
@click.option("--io-size", default="1G", show_default=True, help="Bytes moved per timed repeat.")
@click.option("--repeats", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option(
    "--strategy", type=click.Choice(["grid", "adaptive"]), default="adaptive", show_default=True
)
@click.option(
    "--fio/--no-fio",
    default=True,
    show_default=True,
    help="Measure the fio ceiling for each block size and queue depth.",
)
@click.option("--gpu", is_flag=True, help="GPU buffer with a pinned CPU bounce buffer.")
@click.option("--gds", is_flag=True, help="GPUDirect Storage handle (cuFile).")
@click.option("--budget-minutes", type=float, help="Stop starting new points after this long.")
@click.option(
    "--point-timeout",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds before a point counts as hung.",
)
@click.option("--out", type=click.Path(), help="Run directory (default results/sweep-DATE-TIME).")
@click.option("--resume", type=click.Path(), help="Continue the sweep in this run directory.")
@click.option(
    "--write-config",
    type=click.Path(),
    help="Merge the recommended aio block into this DeepSpeed JSON config.",
)
@json_option
def sweep_aio(
    target: str | None,
    block_size: str,
    queue_depth: str,
    threads: str,
    single_submit: str,
    overlap_events: str,
    ops: str,
    io_size: str,
    repeats: int,
    strategy: str,
    fio: bool,
    gpu: bool,
    gds: bool,
    budget_minutes: float | None,
    point_timeout: float,
    out: str | None,
    resume: str | None,
    write_config: str | None,
) -> None:
    """Tune DeepSpeed's async I/O on a volume against its fio ceiling.

    Each point runs in a fresh process with the real async_io op (aio_handle, pinned
    buffer from new_cpu_locked_tensor, O_DIRECT files); read points drop the page cache
    first and verify it. Failed or hung points are recorded and the sweep goes on. Every
    finished point is in RUN/points.jsonl at once: --resume RUN continues after Ctrl-C or
    a kill. The result: all points by bandwidth, the best per op and the best balanced
    one, and the DeepSpeed "aio" block with the keys the runtime reads.

    \b
    iotune sweep-aio --target /mnt/offload --strategy adaptive
    iotune sweep-aio --target /mnt/offload --block-size 512K,1M --queue-depth 8,32 --threads 1,4 --strategy grid
    iotune sweep-aio --resume results/sweep-20260101-120000 --write-config ds_config.json
    """
    import pandas as pd
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from iotune.sweep import space as sp
    from iotune.sweep.config import write_config as merge_config
    from iotune.sweep.runner import META, Sweep, SweepSpec, check_target
    from iotune.units import parse_size

    if resume:
        run_dir = Path(resume)
        if not (run_dir / META).exists():
            raise UsageError(
                f"{resume} is not a sweep run directory (no {META})",
                hint="name the --out of an earlier sweep",
            )
        spec = SweepSpec.from_json(json.loads((run_dir / META).read_text())["spec"])
    else:
        if not target:
            raise UsageError("--target is required", hint="iotune sweep-aio --target /mnt/offload")
        space = sp.Space(
            block_size=_list(
                block_size, lambda t: parse_size(t, what="--block-size"), "--block-size"
            ),
            queue_depth=_list(queue_depth, _posint("--queue-depth"), "--queue-depth"),
            threads=_list(threads, _posint("--threads"), "--threads"),
            single_submit=_list(single_submit, _bool, "--single-submit"),
            overlap_events=_list(overlap_events, _bool, "--overlap-events"),
            ops=_list(ops, str, "--ops"),
        )
        bad_ops = [o for o in space.ops if o not in ("read", "write")]
        if bad_ops:
            raise UsageError(
                f"--ops: {', '.join(bad_ops)} is not read or write", hint="--ops read,write"
            )
        spec = SweepSpec(
            target=str(Path(target).resolve()),
            space=space,
            io_size=parse_size(io_size, what="--io-size"),
            repeats=repeats,
            strategy=strategy,
            fio=fio,
            gpu=gpu or gds,
            gds=gds,
            budget_s=budget_minutes * 60 if budget_minutes else None,
            point_timeout_s=point_timeout,
        )
        run_dir = Path(out) if out else Path("results") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    if os.geteuid() != 0:
        raise NotRootError("iotune sweep-aio (drops the page cache between read points)")
    check_target(Path(spec.target), spec.io_size, spec.space.threads, spec.space.block_size)
    if spec.gpu:
        info = doctor.probe_torch(build=False)
        if not info.get("gpus"):
            raise UsageError(
                "--gpu/--gds need a CUDA GPU, and torch sees none",
                hint="drop --gpu/--gds on this host",
            )
    # build (or just load) the async_io op once, outside every point's timeout: the first
    # JIT build takes minutes
    if not STATE.json:
        click.echo(
            "iotune: loading DeepSpeed's async_io op (the first time builds it: a few minutes)",
            err=True,
        )
    op_probe = doctor.probe_torch(build=True, timeout=3600)
    aio_state = op_probe.get("aio") or {}
    if not aio_state.get("loaded"):
        reason = (
            aio_state.get("error")
            or op_probe.get("deepspeed_error")
            or op_probe.get("worker_error")
            or "not compatible"
        )
        raise IotuneError(
            f"DeepSpeed's async_io op is not usable: {reason}",
            hint="'iotune doctor --for sweep' says what is missing",
        )
    sweep = Sweep(spec, run_dir.resolve())
    sweep.load()
    done_before = len(sweep.records)
    if done_before and not STATE.json:
        click.echo(f"iotune: resuming {run_dir}: {done_before} point(s) already measured", err=True)
    if not STATE.json:
        click.echo(
            f"iotune: {spec.strategy} sweep of {spec.space.size()} configurations x ops on {spec.target}; "
            f"records in {run_dir}",
            err=True,
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
        disable=STATE.json,
    )
    interrupted = False
    with progress:
        task = progress.add_task("sweep", total=sweep.expected(), completed=done_before)

        def on_point(rec: dict[str, Any], n: int, total: int) -> None:
            bw = (
                f"{rec['bw_bytes_s'] / 2**30:.2f} GiB/s"
                if rec.get("status") == "ok"
                else rec.get("status")
            )
            progress.update(
                task,
                completed=n,
                total=max(total, n),
                description=f"{rec['op']} {format_size(rec['block_size'])} qd{rec['queue_depth']} t{rec['threads']}: {bw}",
            )

        sweep.on_point = on_point
        try:
            records = sweep.run()
        except KeyboardInterrupt:
            interrupted = True
            records = list(sweep.records.values())
    ok = [r for r in records if r.get("status") == "ok"]
    best = sp.best_per_op(records)
    bal = sp.balanced(records)
    rec_cfg = bal[0] if bal else (sp.config_of(next(iter(best.values()))) if best else None)
    aio = sp.aio_block(rec_cfg, use_gds=spec.gds) if rec_cfg else None
    result: dict[str, Any] = {
        "out": str(run_dir.resolve()),
        "strategy": spec.strategy,
        "points": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "interrupted": interrupted,
        "budget_exhausted": sweep.budget_hit,
        "best": best,
        "balanced": {"config": sp.aio_block(bal[0]), "score": bal[1]} if bal else None,
        "aio": aio,
        "ceilings": list(sweep.ceilings.values()),
    }
    if write_config and aio and not interrupted:
        report = merge_config(Path(write_config), aio)
        result["config_written"] = {"path": write_config, "deepspeed_reads": report.get("aio_used")}
    hints = _nvme_path_hints(Path(spec.target))
    result["nvme_path_hints"] = hints
    # `iotune run --aio-config RUN_DIR` reads the recommendation from here
    (run_dir / "result.json").write_text(json.dumps(to_jsonable(result), indent=2) + "\n")
    if STATE.json:
        emit_json(result)
    else:
        con = console()
        if records:
            df = pd.DataFrame(records)
            for col in (
                "pct_of_fio",
                "bw_bytes_s",
                "bw_min",
                "bw_max",
                "block_interval_us",
                "cpu_cores",
            ):
                if col not in df:
                    df[col] = float("nan")
            df = df.sort_values(["op", "bw_bytes_s"], ascending=[True, False], na_position="last")
            con.print(_sweep_table(df))
            con.print()
        for op, r in best.items():
            pct = f", {r['pct_of_fio']:.0f}% of fio" if r.get("pct_of_fio") else ""
            con.print(
                f"best {op}: {r['bw_bytes_s'] / 2**30:.2f} GiB/s ({r['bw_bytes_s'] / 1e9:.2f} GB/s{pct}) with "
                f"block {format_size(r['block_size'])}, queue depth {r['queue_depth']}, {r['threads']} thread(s), "
                f"single_submit {str(r['single_submit']).lower()}, overlap_events {str(r['overlap_events']).lower()}"
            )
        if bal:
            con.print(
                f"best balanced (geometric mean of read and write vs their bests: {bal[1]:.2f}): "
                f"{json.dumps(sp.aio_block(bal[0]))}"
            )
        if aio:
            con.print('\nDeepSpeed config:\n"aio": ' + json.dumps(aio, indent=2))
        for h in hints:
            con.print(h)
        if "config_written" in result:
            con.print(
                f"merged into {write_config} (DeepSpeed reads: {json.dumps(result['config_written']['deepspeed_reads'])})"
            )
        con.print(
            f"records: {run_dir}/points.jsonl ({len(ok)} ok, {len(records) - len(ok)} failed)"
        )
    if interrupted:
        click.echo(
            f"iotune: interrupted; continue with: iotune sweep-aio --resume {run_dir}", err=True
        )
        sys.exit(130)
    if not ok:
        raise IotuneError(
            "no point succeeded",
            hint=f"see the errors in {run_dir}/points.jsonl; --debug shows the workers' output",
        )


def _nvme_path_hints(target: Path) -> list[str]:
    """Offload config hints when the target lives on an md RAID volume."""
    from iotune.trace.targets import resolve_path

    try:
        t = resolve_path(SysTree("/"), str(target))
    except IotuneError:
        return []
    if not t.arrays:
        return []
    a = t.arrays[0]
    return [
        f"{target} is on {a.level} {a.name} ({', '.join(a.members)}): use it as "
        f'"offload_optimizer": {{"device": "nvme", "nvme_path": "{target}"}} and '
        f'"offload_param": {{"device": "nvme", "nvme_path": "{target}"}} (ZeRO stage 3)'
    ]


@click.command("sweep-threads")
@click.option(
    "--params",
    default="2B",
    show_default=True,
    help="Parameters the optimizer updates (2B, 500M, 1e8).",
)
@click.option(
    "--threads", default="1,2,4,6,8", show_default=True, help="OpenMP thread counts to time."
)
@click.option("--repeats", type=click.IntRange(1, 100), default=5, show_default=True)
@json_option
def sweep_threads(params: str, threads: str, repeats: int) -> None:
    """DeepSpeedCPUAdam optimizer-step time as a function of OpenMP threads.

    The seed study's other sweep: the CPU optimizer is memory-bandwidth bound, so past some
    thread count more threads stop helping. Each thread count runs in its own process
    (OMP_NUM_THREADS is read when the op loads) with the real DeepSpeedCPUAdam on PARAMS
    fp32 parameters: a warm-up step, then the median of REPEATS timed steps.
    """
    from iotune.sweep.threads import parse_params, run_thread_sweep

    n = parse_params(params)
    counts = _list(threads, _posint("--threads"), "--threads")
    need = n * 16  # fp32 parameter, gradient and two Adam moments
    avail = doctor.meminfo(SysTree("/")).get("MemAvailable", 0)
    if need > avail * 0.8:
        raise UsageError(
            f"{params} parameters need {need / 2**30:.1f} GiB of RAM (16 bytes each), "
            f"{avail / 2**30:.1f} GiB is available",
            hint="pass a smaller --params, e.g. --params 500M",
        )
    rows = run_thread_sweep(
        n,
        counts,
        repeats,
        on_row=None
        if STATE.json
        else (
            lambda r: click.echo(
                f"iotune: {r['threads']} thread(s): {r.get('step_ms_median', float('nan')):.1f} ms",
                err=True,
            )
        ),
    )
    ok = [r for r in rows if r["status"] == "ok"]
    best = min(ok, key=lambda r: r["step_ms_median"]) if ok else None
    if STATE.json:
        emit_json({"params": n, "rows": rows, "best_threads": best["threads"] if best else None})
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("THREADS", "STEP MS (MEDIAN)", "MIN", "MAX", "STATUS"):
        table.add_column(col, justify="right" if col != "STATUS" else "left")
    for r in rows:
        good = r["status"] == "ok"
        table.add_row(
            str(r["threads"]),
            f"{r['step_ms_median']:.1f}" if good else "-",
            f"{r['step_ms_min']:.1f}" if good else "-",
            f"{r['step_ms_max']:.1f}" if good else "-",
            "ok" if good else f"{r['status']}: {r.get('error', '')[:60]}",
        )
    console().print(table)
    if best:
        console().print(
            f"best: {best['threads']} thread(s), {best['step_ms_median']:.1f} ms per optimizer step "
            f"for {n:,} parameters"
        )
    else:
        raise IotuneError("no thread count succeeded", hint="--debug shows the workers' errors")
