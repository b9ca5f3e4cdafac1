"""`iotune sweep-aio` and `iotune sweep-threads`: DeepSpeed async I/O and CPU optimizer sweeps.

The rules (op validation, the picks, result.json, the RAM requirement, when a sweep failed)
live in :mod:`iotune.sweep`; this module turns options into a spec, shows progress and
renders.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from iotune.cli.options import STATE, comma_list, json_option, parse_bool, positive_int
from iotune.errors import IotuneError, NotRootError, UsageError
from iotune.render import console, emit_json

if TYPE_CHECKING:
    from iotune.sweep.runner import Sweep, SweepSpec


def _new_spec(
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
    swap_pattern: str | None = None,
    swap_rounds: int = 2,
    swap_set: tuple[str, ...] = (),
    **_: Any,
) -> SweepSpec:
    """A fresh sweep's spec from the option strings (the other options are not part of it)."""
    from iotune.sweep import space as sp
    from iotune.sweep.runner import SweepSpec
    from iotune.units import parse_size

    if not target:
        raise UsageError("--target is required", hint="iotune sweep-aio --target /mnt/offload")
    space = sp.Space(
        block_size=comma_list(
            block_size, lambda t: parse_size(t, what="--block-size"), "--block-size"
        ),
        queue_depth=comma_list(queue_depth, positive_int("--queue-depth"), "--queue-depth"),
        threads=comma_list(threads, positive_int("--threads"), "--threads"),
        single_submit=comma_list(single_submit, parse_bool, "--single-submit"),
        overlap_events=comma_list(overlap_events, parse_bool, "--overlap-events"),
        ops=comma_list(ops, str, "--ops"),
    )
    sp.check_ops(space.ops)
    if swap_set and not swap_pattern:
        raise UsageError(
            "--set changes the --swap-pattern preset, and none is named",
            hint="iotune sweep-aio --target DIR --swap-pattern tiny_opt_nvme --set model.num_hidden_layers=1",
        )
    return SweepSpec(
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
        swap_preset=swap_pattern,
        swap_rounds=swap_rounds,
        swap_sets=tuple(swap_set),
    )


def _say(message: str) -> None:
    if not STATE.json:
        click.echo(message, err=True)


def _spec_and_dir(resume: str | None, out: str | None) -> tuple[SweepSpec, Path]:
    """The spec and run directory of the sweep to continue (--resume) or to start."""
    from iotune.sweep.runner import load_spec

    if resume:
        return load_spec(resume), Path(resume)
    spec = _new_spec(**click.get_current_context().params)
    return spec, Path(out) if out else Path("results") / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"


def _open(spec: SweepSpec, run_dir: Path) -> Sweep:
    """Refuse what cannot run here, load the async_io op once, and pick up earlier points."""
    from iotune.sweep.runner import Sweep, check_gpu, check_target, load_aio_op

    if os.geteuid() != 0:
        raise NotRootError("iotune sweep-aio (drops the page cache between read points)")
    check_target(Path(spec.target), spec.io_size, spec.space.threads, spec.space.block_size)
    if spec.swap_preset:
        from iotune.sweep.swap import check_room

        check_room(spec)
    check_gpu(spec)
    _say("iotune: loading DeepSpeed's async_io op (the first time builds it: a few minutes)")
    load_aio_op()
    from iotune.sweep.latency import PointLatency

    latency = PointLatency(spec.target)
    if latency.why_not:
        _say(f"iotune: no drive latency per point ({latency.why_not})")
    sweep = Sweep(spec, run_dir.resolve(), latency=latency)
    sweep.load()
    if sweep.records:
        _say(f"iotune: resuming {run_dir}: {len(sweep.records)} point(s) already measured")
    _say(
        f"iotune: {spec.strategy} sweep of {spec.space.size()} configurations x ops on {spec.target}; "
        f"records in {run_dir}"
    )
    return sweep


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
@click.option(
    "--swap-pattern",
    metavar="PRESET",
    help="After the points, time PRESET's optimizer swapping (DeepSpeed's files and order) "
    "at the recommended aio block; 'iotune estimate' predicts from it.",
)
@click.option(
    "--swap-rounds",
    type=click.IntRange(1, 20),
    default=2,
    show_default=True,
    help="Steps of swapping timed by --swap-pattern.",
)
@click.option(
    "--set",
    "swap_set",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override the --swap-pattern preset as 'iotune run --set' does (its model, "
    "seq_len, ds.* keys), so the rehearsal swaps the files of the run you will start.",
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
    swap_pattern: str | None,
    swap_rounds: int,
    swap_set: tuple[str, ...],
    out: str | None,
    resume: str | None,
    write_config: str | None,
) -> None:
    """Tune DeepSpeed's async I/O on a volume against its fio ceiling.

    The points run one after another in a worker process (--gpu/--gds points: a fresh
    process each) with the real async_io op (aio_handle, pinned buffer from
    new_cpu_locked_tensor, O_DIRECT files); read points drop the page cache first and
    verify it. A failed or hung point is recorded, its worker replaced by a fresh one, and
    the sweep goes on. Every finished point is in RUN/points.jsonl at once: --resume RUN
    continues after Ctrl-C or a kill. The result: all points by bandwidth, the best per op
    and the best balanced one, and the DeepSpeed "aio" block with the keys the runtime
    reads.

    \b
    iotune sweep-aio --target /mnt/offload --strategy adaptive
    iotune sweep-aio --target /mnt/offload --block-size 512K,1M --queue-depth 8,32 --threads 1,4 --strategy grid
    iotune sweep-aio --resume results/sweep-20260101-120000 --write-config ds_config.json
    """
    from iotune.sweep.render import print_result, run_with_progress
    from iotune.sweep.result import finish, write_result

    spec, run_dir = _spec_and_dir(resume, out)
    sweep = _open(spec, run_dir)
    records, interrupted = run_with_progress(sweep, quiet=STATE.json)
    result = finish(sweep, run_dir, records, interrupted=interrupted, write_config=write_config)
    if spec.swap_preset and result["aio"] and not interrupted:
        result["swap"] = _swap(spec, run_dir, result["aio"])
        write_result(run_dir, result)
    if STATE.json:
        emit_json(result)
    else:
        print_result(console(), records, result, run_dir, write_config)
    if interrupted:
        click.echo(
            f"iotune: interrupted; continue with: iotune sweep-aio --resume {run_dir}", err=True
        )
        sys.exit(130)
    if not result["ok"]:
        raise IotuneError(
            "no point succeeded",
            hint=f"see the errors in {run_dir}/points.jsonl; --debug shows the workers' output",
        )


def _swap(spec: SweepSpec, run_dir: Path, aio: dict[str, Any]) -> dict[str, Any]:
    """Rehearse the preset's optimizer swapping at the recommended aio block (once: a
    resumed sweep keeps a finished rehearsal)."""
    from iotune.sweep import swap
    from iotune.sweep.render import swap_line

    preset = spec.swap_preset or ""
    point, _ = swap.plan(preset, aio, spec.swap_sets)
    done = swap.find(run_dir, preset, swap.config_of(point), spec.swap_sets)
    if done is None:
        _say(
            f"iotune: rehearsing {preset}'s optimizer swapping ({spec.swap_rounds} step(s)) at "
            "the recommended aio block"
        )
        done = swap.rehearse(
            run_dir,
            Path(spec.target),
            point,
            spec.swap_rounds,
            spec.point_timeout_s * (spec.swap_rounds + 1),
        )
    _say("iotune: " + swap_line(done))
    return done


def _threads_row(row: dict[str, Any], done: list[dict[str, Any]], n: int, run_dir: Path) -> None:
    """One thread count timed: say so and keep every row so far (an interrupt loses none)."""
    from iotune.sweep.threads import row_ranks, save_threads, threads_doc

    done.append(row)
    save_threads(run_dir, threads_doc(done, n, run_dir))
    ranks = row_ranks(row)
    side = f"{ranks} ranks at once, " if ranks > 1 else ""
    _say(
        f"iotune: {side}{row['threads']} thread(s): "
        f"{row.get('step_ms_median', float('nan')):.1f} ms"
    )


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
@click.option(
    "--ranks",
    default="1",
    show_default=True,
    help="Ranks stepping at once, each on its share of PARAMS at each thread count, as the "
    "ranks of a node do (1,2,4: a row for each).",
)
@click.option("--repeats", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option(
    "--memory/--no-memory",
    default=True,
    show_default=True,
    help="Also measure the host's memory bandwidth (STREAM's copy and triad) at each thread "
    "count; 'iotune estimate --threads-config RUN' takes it as the host's.",
)
@click.option(
    "--out",
    type=click.Path(),
    help="Run directory for threads.json (default results/threads-DATE-TIME); "
    "'iotune estimate --threads-config RUN' reads it.",
)
@json_option
def sweep_threads(
    params: str, threads: str, ranks: str, repeats: int, memory: bool, out: str | None
) -> None:
    """DeepSpeedCPUAdam optimizer-step time as a function of OpenMP threads.

    The seed study's other sweep: the CPU optimizer is memory-bandwidth bound, so past some
    thread count more threads stop helping. Each thread count runs in its own process
    (OMP_NUM_THREADS is read when the op loads) with the real DeepSpeedCPUAdam on PARAMS
    fp32 parameters: a warm-up step, then the median of REPEATS timed steps. The rows are
    kept in RUN/threads.json after each thread count; 'iotune estimate PRESET
    --threads-config RUN' predicts the optimizer's CPU time from them.

    With --ranks R, R processes step at once, each on PARAMS/R (ZeRO's partition of the
    optimizer), every step started together as a node's ranks are; a step takes as long
    as the slowest rank. 'iotune estimate --ranks R --threads-config RUN' then takes CPU
    Adam as measured with R ranks sharing the cores and the memory:

    iotune sweep-threads --params 2B --threads 1,2,4 --ranks 1,2,4
    """
    from iotune.probes.meminfo import mem_available
    from iotune.probes.sysfs import SysTree
    from iotune.sweep.render import best_lines, memory_line, threads_table
    from iotune.sweep.threads import (
        check_memory,
        failure,
        parse_params,
        run_memory_probe,
        run_thread_sweep,
        save_threads,
        threads_doc,
    )

    n = parse_params(params)
    counts = comma_list(threads, positive_int("--threads"), "--threads")
    rank_counts = comma_list(ranks, positive_int("--ranks"), "--ranks")
    available = mem_available(SysTree("/"))
    check_memory(n, params, available)
    run_dir = (
        Path(out) if out else Path("results") / f"threads-{time.strftime('%Y%m%d-%H%M%S')}"
    ).resolve()
    done: list[dict[str, Any]] = []
    rows = run_thread_sweep(
        n,
        counts,
        repeats,
        on_row=lambda r: _threads_row(r, done, n, run_dir),
        ranks=rank_counts,
    )
    probe = None
    if memory:
        _say("iotune: the host's memory bandwidth (copy, triad) at each thread count")
        probe = run_memory_probe(counts, available)
    doc = threads_doc(rows, n, run_dir, probe)
    save_threads(run_dir, doc)
    if STATE.json:
        emit_json(doc)
    else:
        console().print(threads_table(rows))
        for line in best_lines(rows, n, doc["best_threads_by_ranks"]):
            console().print(line)
        if probe is not None:
            console().print(memory_line(probe))
    error = failure(rows)
    if error is not None:
        raise error
