"""`iotune sweep-checkpoint`: the fast checkpoint writer's knobs, tuned on the checkpoint
volume with real saves (iotune.sweep.ckpt has the search and its rules)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import click

from iotune.cli.copy_sweep import sub_group
from iotune.cli.options import STATE, comma_list, json_option, parse_bool, positive_int
from iotune.errors import IotuneError, NotRootError, UsageError
from iotune.records import append_record
from iotune.render import console, emit_json, err_console
from iotune.sweep import ckpt


def _say(message: str) -> None:
    if not STATE.json:
        err_console().print(message, soft_wrap=True, highlight=False)


def _spec(params: int, sub_group: int, target: str, space: ckpt.Space) -> dict[str, Any]:
    return {"params": params, "sub_group": sub_group, "target": target, "space": space.to_json()}


def _check(target: Path, state_bytes: int, space: ckpt.Space) -> None:
    """Bad input is refused before anything is written."""
    from iotune.probes.meminfo import mem_available
    from iotune.probes.sysfs import SysTree
    from iotune.sweep.runner import check_target

    for size in space.io_buffer_size:
        if size % (2 * 4096):
            raise UsageError(
                f"--io-buffer-size {size} is not a multiple of 8K",
                hint="DeepSpeed splits the buffer in two aligned halves: e.g. 64M,256M",
            )
    check_target(target, math.ceil(state_bytes / 4096) * 4096, (1,), space.block_size)
    avail = mem_available(SysTree("/"))
    if state_bytes > 0.8 * avail:
        raise UsageError(
            f"the state to save takes {state_bytes / 2**30:.1f} GiB of RAM, "
            f"{avail / 2**30:.1f} GiB is available",
            hint="pass fewer --params",
        )


def _ceiling(aio_config: str | None, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    if aio_config is None:
        _say(
            "iotune: the volume's own write ceiling: O_DIRECT writes of the state's size through the aio op"
        )
        return ckpt.save_in_worker({**spec, "writer": "ceiling"}, timeout)
    from iotune.sweep.run import SweepRun, run_dir

    best = SweepRun.load(run_dir(Path(aio_config))).best_per_op().get("write")
    if not best:
        raise UsageError(
            f"--aio-config {aio_config} has no write point",
            hint="a sweep-aio run with --ops write (or read,write) on the checkpoint volume",
        )
    keep = ("block_size", "queue_depth", "threads", "io_size", "bw_bytes_s")
    return {
        "status": "ok",
        "bw_bytes_s": best["bw_bytes_s"],
        "source": f"sweep-aio {aio_config}",
        "best": {k: best.get(k) for k in keep},
    }


@click.command("sweep-checkpoint")
@click.option("--target", type=click.Path(), help="Directory on the checkpoint volume.")
@click.option(
    "--copy-from",
    type=click.Path(),
    help="A directory on the offload volume: sweep the copy a save makes of NVMe-offloaded "
    "optimizer state from there into --target (aio at each --block-size, --queue-depth and "
    "--threads, default 1M,8M x 32,64 x 4,8), against the raw O_DIRECT copy and DeepSpeed's "
    "copytree, each point once a round for --rounds rounds.",
)
@click.option(
    "--params",
    default="500M",
    show_default=True,
    help="Parameters of a rank's ZeRO-3 partition: the save is 12 bytes each (2B, 500M).",
)
@click.option(
    "--sub-group-size",
    default="1e9",
    show_default=True,
    help="ZeRO-3's sub_group_size: the state's tensors hold at most this many parameters.",
)
@click.option("--io-buffer-size", default="16M,64M,256M,1G", show_default=True)
@click.option("--io-buffer-double", default="true,false", show_default=True)
@click.option("--block-size", default="256K,1M,4M,16M", show_default=True, help="aio block_size.")
@click.option("--queue-depth", default="8,32,128", show_default=True, help="aio queue_depth.")
@click.option("--threads", default="1,4,8", show_default=True, help="aio intra_op_parallelism.")
@click.option(
    "--rounds",
    type=click.IntRange(1, 10),
    default=3,
    show_default=True,
    help="Rounds of the search at most: another round, from the best, while one finds a faster save (a resumed run keeps its own).",
)
@click.option(
    "--aio-config",
    type=click.Path(exists=True),
    help="A sweep-aio run of the volume: its best write is the ceiling (else measured here).",
)
@click.option(
    "--point-timeout", type=float, default=1800.0, show_default=True, help="Seconds per save."
)
@click.option("--out", type=click.Path(), help="Run directory (default results/ckpt-DATE-TIME).")
@click.option(
    "--resume", type=click.Path(exists=True), help="Continue the search in this run directory."
)
@click.option(
    "--write-config",
    type=click.Path(),
    help="Merge the best writer (checkpoint.writer, and aio where the config has none) into this DeepSpeed JSON config.",
)
@json_option
def sweep_checkpoint(
    target: str | None,
    copy_from: str | None,
    params: str,
    sub_group_size: str,
    io_buffer_size: str,
    io_buffer_double: str,
    block_size: str,
    queue_depth: str,
    threads: str,
    rounds: int,
    aio_config: str | None,
    point_timeout: float,
    out: str | None,
    resume: str | None,
    write_config: str | None,
) -> None:
    """Tune DeepSpeed's fast checkpoint writer on the checkpoint volume, with real saves.

    Each point saves a ZeRO-3 optimizer state of PARAMS parameters (12 bytes each: the
    fp32 master and Adam's moments) with DeepSpeed's FastFileWriter, the writer of the
    "fast" and "decoupled" engines, timed to its fsync. The knobs are searched one at a
    time from DeepSpeed's defaults, each keeping the fastest save so far: torch.save's
    CRC32 of each record, the writer's copy of each record (numpy, before its pinned
    buffer's), io_buffer_size, io_buffer_double, then the aio block_size, queue_depth and
    intra_op_parallelism it writes with; then again from the best, while a round finds a
    faster save (--rounds, 3 by default). torch.save of the same state is timed too (until it returns, which the
    step waits for, and until fsync), against the volume's own write ceiling. The result
    says where the default lost its time and what each knob gained.

    \b
    iotune sweep-checkpoint --target /mnt/ckpt --params 1B --write-config ds_config.json
    iotune sweep-checkpoint --resume results/ckpt-20260101-120000

    Each save is kept in RUN/ckpt_points.jsonl as it ends: Ctrl-C or a kill loses none.

    With --copy-from OFFLOAD_DIR, the save of NVMe-offloaded state instead: its copy of the
    swap files (12 bytes a parameter) from the offload volume into --target, by iotune's aio
    copy at each setting, against the raw O_DIRECT copy between the two (the ceiling),
    DeepSpeed's shutil.copytree and, where the volumes clone, reflink; each copy timed to
    durability, the page cache dropped before each, in turns for --rounds rounds:

    \b
    iotune sweep-checkpoint --copy-from /mnt/offload --target /mnt/ckpt --params 1B
    """
    from iotune.sweep.threads import parse_params
    from iotune.units import parse_size

    if resume and (Path(resume) / "spec.json").is_file():
        spec = json.loads((Path(resume) / "spec.json").read_text())
        if "copy_from" in spec:
            from iotune.cli.copy_sweep import copy_mode

            copy_mode(spec, Path(resume).resolve(), point_timeout)
            return
    if copy_from is not None and not resume:
        from iotune.cli.copy_sweep import copy_mode, copy_spec

        copy_mode(
            copy_spec(
                copy_from, target, params, sub_group_size, block_size, queue_depth, threads, rounds
            ),
            (
                Path(out) if out else Path("results") / f"copy-{time.strftime('%Y%m%d-%H%M%S')}"
            ).resolve(),
            point_timeout,
        )
        return
    if resume:
        run_dir = Path(resume).resolve()
        spec = json.loads((run_dir / "spec.json").read_text())
        space = ckpt.Space.from_json(spec["space"])
    else:
        if not target:
            raise UsageError(
                "--target is required",
                hint="iotune sweep-checkpoint --target /mnt/ckpt --params 1B",
            )
        space = ckpt.Space(
            io_buffer_size=comma_list(
                io_buffer_size, lambda t: parse_size(t, what="--io-buffer-size"), "--io-buffer-size"
            ),
            io_buffer_double=comma_list(io_buffer_double, parse_bool, "--io-buffer-double"),
            block_size=comma_list(
                block_size, lambda t: parse_size(t, what="--block-size"), "--block-size"
            ),
            queue_depth=comma_list(queue_depth, positive_int("--queue-depth"), "--queue-depth"),
            threads=comma_list(threads, positive_int("--threads"), "--threads"),
            rounds=rounds,
        )
        n = parse_params(params)
        spec = _spec(n, sub_group(sub_group_size), str(Path(target).resolve()), space)
        run_dir = (
            Path(out) if out else Path("results") / f"ckpt-{time.strftime('%Y%m%d-%H%M%S')}"
        ).resolve()
    if write_config:
        from iotune.sweep.config import read_config

        read_config(Path(write_config))  # a config that cannot be merged is refused first
    if os.geteuid() != 0:
        raise NotRootError("iotune sweep-checkpoint (drops each save's pages from the page cache)")
    state_bytes = ckpt.STATE_BYTES_PER_PARAM * int(spec["params"])
    _check(Path(spec["target"]), state_bytes, space)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    records = ckpt.load_points(run_dir)
    if records:
        _say(f"iotune: resuming {run_dir}: {len(records)} save(s) already timed")
    base = {k: spec[k] for k in ("params", "sub_group", "target")}
    interrupted = False
    try:
        if not any(r.get("writer") == "torch" for r in records):
            _say("iotune: torch.save of the same state, the baseline")
            rec = {
                "writer": "torch",
                "stage": "baseline",
                **ckpt.save_in_worker({**base, "writer": "torch", "verify": True}, point_timeout),
            }
            append_record(run_dir / ckpt.POINTS, rec)
            records.append(rec)
        if not any(r.get("writer") == "ceiling" for r in records):
            rec = {
                "writer": "ceiling",
                "stage": "ceiling",
                **_ceiling(aio_config, base, point_timeout),
            }
            append_record(run_dir / ckpt.POINTS, rec)
            records.append(rec)
        _say(
            f"iotune: {space.size()} saves of {state_bytes / 2**30:.2f} GiB on {spec['target']} "
            + (
                "in the first round (another round, while one finds a faster save); "
                if space.rounds > 1
                else "; "
            )
            + f"records in {run_dir}"
        )
        _search(space, records, base, point_timeout, run_dir)
    except KeyboardInterrupt:
        interrupted = True
        _clean(Path(spec["target"]))
    ceiling = next(
        (r for r in records if r.get("writer") == "ceiling" and r.get("status") == "ok"), None
    )
    result = {
        **ckpt.summarize(records, ceiling),
        "params": spec["params"],
        "state_bytes": state_bytes,
        "target": spec["target"],
        "out": str(run_dir),
        "interrupted": interrupted,
        "points": ckpt.fast_records(records),
    }
    if write_config and result["best"] is not None and not interrupted:
        result["written"] = _write(Path(write_config), ckpt.knobs_of(result["best"]))
    (run_dir / ckpt.RESULT).write_text(json.dumps(result, indent=2) + "\n")
    if STATE.json:
        emit_json(result)
    else:
        from iotune.sweep.ckpt_render import print_result

        print_result(console(), result)
    if interrupted:
        raise SystemExit(130)
    if result["best"] is None:
        raise IotuneError(
            "no save of the fast writer succeeded",
            hint=f"the errors are in {run_dir / ckpt.POINTS}; --debug shows the workers' output",
        )


def _clean(target: Path, wait_s: float = 30.0) -> None:
    """After an interrupt: the cut save's worker removes its file once it has stopped;
    whatever is left after *wait_s* is removed here."""
    from iotune.workers.ckpt_save import FILE

    pattern = FILE.format(pid="*")
    deadline = time.monotonic() + wait_s
    while list(target.glob(pattern)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for f in target.glob(pattern):
        f.unlink(missing_ok=True)


def _search(
    space: ckpt.Space,
    records: list[dict[str, Any]],
    base: dict[str, Any],
    timeout: float,
    run_dir: Path,
) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        transient=True,
        console=err_console(),
        disable=STATE.json,
    )

    def measure(stage: str, k: ckpt.Knobs) -> dict[str, Any]:
        progress.update(task, description=f"{stage}: {k.label()}")
        return ckpt.save_in_worker(
            {**base, "writer": "fast", "verify": True, **k.__dict__}, timeout
        )

    def done(rec: dict[str, Any], n: int) -> None:
        progress.update(task, completed=n, total=max(space.size(), n))

    with progress:
        task = progress.add_task(
            "saves", total=space.size(), completed=len(ckpt.fast_records(records))
        )
        ckpt.run_search(space, records, measure, run_dir, done)


def _write(path: Path, best: ckpt.Knobs) -> dict[str, Any]:
    """The best writer merged into the DeepSpeed config at *path*, checked by DeepSpeed."""
    from iotune.sweep.config import read_config, write_merged

    merged, note = ckpt.merge_checkpoint(read_config(path), best)
    report = write_merged(path, merged)
    return {"path": str(path), "note": note, "writer_used": report.get("writer_used")}
