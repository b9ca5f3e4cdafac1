"""`iotune study`: a grid of presets, planned, run one after another and recorded; the
rules live in :mod:`iotune.study`, this module reads options, prints and exits."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from iotune.cli.options import STATE, comma_list, interrupted_exit, json_option, positive_int
from iotune.errors import IotuneError, UsageError
from iotune.render import console, emit_json, err_console
from iotune.units import gib_text

if TYPE_CHECKING:
    from iotune.train.preflight import Gpus


def plan_table(rows: list[dict[str, Any]]) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold", title="the study's plan")
    for col in ("RUN", "STEPS", "NVMe GiB", "R/W GiB per step", "RAM GiB", "GPU GiB", "FITS"):
        t.add_column(col, justify="left" if col in ("RUN", "FITS") else "right")
    for r in rows:
        rw = (
            f"{gib_text(r['read_bytes_step'])}/{gib_text(r['write_bytes_step'])}"
            if r["read_bytes_step"]
            else "-"
        )
        t.add_row(
            r.get("run") or r["preset"],
            str(r["steps"]),
            gib_text(r["nvme_bytes"]) if r["nvme_bytes"] else "-",
            rw,
            gib_text(r["host_bytes"]),
            gib_text(r["gpu_bytes"]),
            "yes" if r["fits"] else f"no: {r['reason']}",
        )
    return t


def result_table(records: list[dict[str, Any]]) -> Table:
    from iotune.report.tables import num, predicted

    t = Table(box=None, pad_edge=False, header_style="bold", title="the study (GiB = 2^30 bytes)")
    for col in (
        "RUN",
        "STATUS",
        "STEP s",
        "PREDICTED",
        "OPTIMIZER s",
        "READ GiB/step (est.)",
        "WRITE GiB/step (est.)",
    ):
        t.add_column(col, justify="left" if col in ("RUN", "STATUS") else "right")
    for r in records:
        m, e = r.get("measured") or {}, r.get("estimate") or {}
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r.get('error')}"
        t.add_row(
            r.get("run") or r["preset"],
            status,
            num(m.get("step_s")),
            num(predicted(r, "step_s")),
            num(m.get("optimizer_s")),
            _beside(m.get("read_gib"), e.get("read_gib")),
            _beside(m.get("write_gib"), e.get("write_gib")),
        )
    return t


def _beside(measured: float | None, estimated: float | None) -> str:
    """Measured (estimated); a run that moves nothing on NVMe and is not meant to: -."""
    from iotune.report.tables import num

    if measured is None and not estimated:
        return "-"
    return f"{num(measured)} ({num(estimated)})"


def _gpu(items: list[Any]) -> Gpus | None:
    from iotune.train.preflight import gpu_info

    return gpu_info() if any(it.preset.accelerator == "cuda" for it in items) else None


@click.command("study")
@click.option("--sizes", help="Model sizes of the grid, e.g. 1b,3b (default 1b).")
@click.option("--strategies", help="Strategies, e.g. opt_ram,opt_nvme (default: all).")
@click.option("--ga", "gas", help="Gradient accumulations, e.g. 1,4,8 (default: the grid's).")
@click.option(
    "--presets", "names", help="Run these presets instead of a grid (e.g. the tiny CPU ones)."
)
@click.option("--steps", type=click.IntRange(1, 100000), help="Optimizer steps of every run.")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a field of every run, as for 'iotune run' (not ga or steps). Repeatable.",
)
@click.option("--nvme-path", type=click.Path(), help="Offload directory of the NVMe strategies.")
@click.option("--raid-path", type=click.Path(), help="Offload directory of the *_raid0 ones.")
@click.option(
    "--volume",
    "volumes",
    multiple=True,
    metavar="NAME=DIR[,aio=SWEEP]",
    help="An offload volume: every NVMe run runs on each (repeat it), with that volume's "
    "sweep-aio run if given.",
)
@click.option("--force", is_flag=True, help="Allow a --volume on the root drive.")
@click.option(
    "--aio-config",
    type=click.Path(),
    help="A sweep-aio run: its aio block for every run, and its bandwidth for the prediction.",
)
@click.option(
    "--threads-config", type=click.Path(), help="A sweep-threads run, for the prediction."
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "libbpf", "bcc", "diskstats"]),
    default="auto",
    show_default=True,
    help="How the drives are measured, as for 'iotune trace'.",
)
@click.option("--out", type=click.Path(), help="Study directory (default results/study-DATE-TIME).")
@click.option(
    "--resume",
    type=click.Path(),
    metavar="DIR",
    help="Go on with the study in DIR: finished runs are kept, the one in flight is redone.",
)
@click.option(
    "--ranks",
    type=click.IntRange(1, 1024),
    help="Run every preset on N ranks of this node through DeepSpeed's launcher (one per GPU).",
)
@click.option("--dry-run", is_flag=True, help="Print the plan and stop.")
@json_option
def study_cmd(
    sizes: str | None,
    strategies: str | None,
    gas: str | None,
    names: str | None,
    steps: int | None,
    sets: tuple[str, ...],
    nvme_path: str | None,
    raid_path: str | None,
    volumes: tuple[str, ...],
    force: bool,
    aio_config: str | None,
    threads_config: str | None,
    backend: str,
    out: str | None,
    resume: str | None,
    ranks: int | None,
    dry_run: bool,
) -> None:
    """Run the study's grid: every preset of SIZES x STRATEGIES x GA (or --presets), each
    traced as 'iotune trace --run' does, in its own directory under the study's.

    \b
    iotune study --sizes 1b --strategies opt_ram,opt_nvme --ga 1,4 --nvme-path /mnt/nvme
    iotune study --presets tiny_opt_ram,tiny_opt_nvme --ga 1,2 --steps 2
    iotune study --sizes 1b --strategies opt_ram,opt_nvme,params_opt_nvme \\
        --volume single=/mnt/nvme0 --volume raid0x4=/mnt/md0,aio=results/sweep-md0
    iotune study --resume results/study-20261122-101500
    iotune report results/study-20261122-101500

    The plan comes first: each run with its estimate and whether it fits this host (GPU
    memory, host RAM, NVMe space, a RAID0 volume where the strategy needs one). A run that
    does not fit is recorded as skipped with the numbers; a run that fails is recorded
    with its error and the grid goes on. Each run's summary is appended to DIR/runs.jsonl
    as it ends, so after Ctrl-C, a kill or a crash '--resume DIR' keeps every finished
    run and redoes the one in flight. With --aio-config SWEEP_RUN and --threads-config
    THREADS_RUN every run also prints its predicted step time.

    With --volume the study runs every NVMe strategy on each volume (a single drive, an
    md RAID0, ...): each record says the drives behind it, its RAID level, chunk and
    member count, and 'iotune report' puts the volumes side by side with a figure of
    step time against the number of drives.
    """
    from iotune.cli.trace import backend_for
    from iotune.study import plan as sp
    from iotune.study.runner import Progress, StudyInterrupted, StudySpec, plan, run_study

    if resume:
        given = [
            n
            for n, v in (
                ("--sizes", sizes),
                ("--strategies", strategies),
                ("--ga", gas),
                ("--presets", names),
                ("--steps", steps),
                ("--set", sets),
                ("--nvme-path", nvme_path),
                ("--raid-path", raid_path),
                ("--volume", volumes),
                ("--aio-config", aio_config),
                ("--threads-config", threads_config),
                ("--ranks", ranks),
                ("--out", out),
            )
            if v
        ]
        if given:
            raise UsageError(
                f"--resume goes on with the study as it was asked: drop {', '.join(given)}",
                hint=f"iotune study --resume {resume}",
            )
        out_dir = Path(resume).resolve()
        spec = StudySpec.load(out_dir)
        items = spec.presets()
    else:
        items = sp.expand(
            list(comma_list(sizes, str, "--sizes")) if sizes else None,
            list(comma_list(strategies, str, "--strategies")) if strategies else None,
            list(comma_list(gas, positive_int("--ga"), "--ga")) if gas else None,
            list(comma_list(names, str, "--presets")) if names else None,
            steps,
            sets,
        )
        vols = []
        if volumes:
            from iotune.study.volumes import volumes_from_options

            if nvme_path or raid_path:
                raise UsageError(
                    "--volume names every offload directory: drop --nvme-path and --raid-path",
                    hint="iotune study ... --volume single=/mnt/nvme0 --volume raid0=/mnt/md0",
                )
            vols = volumes_from_options(volumes, force=force)
            if not any(it.preset.strategy.uses_nvme for it in items):
                raise UsageError(
                    "--volume given, but no run of the study offloads to NVMe",
                    hint="add an NVMe strategy, e.g. --strategies opt_ram,opt_nvme",
                )
        stamp = time.strftime("%Y%m%d-%H%M%S")
        out_dir = (Path(out) if out else Path("results") / f"study-{stamp}").resolve()
        if (out_dir / "study.json").exists():
            raise UsageError(
                f"{out_dir} already holds a study", hint=f"iotune study --resume {out_dir}"
            )
        spec = StudySpec.of(
            items,
            backend_for(backend),
            nvme_path=str(Path(nvme_path).resolve()) if nvme_path else None,
            raid_path=str(Path(raid_path).resolve()) if raid_path else None,
            aio_config=str(Path(aio_config).resolve()) if aio_config else None,
            threads_config=str(Path(threads_config).resolve()) if threads_config else None,
            ranks=ranks or 1,
            volumes=[v.to_json() for v in vols],
            sets=list(sets),
        )
        items = spec.presets()
    gpu = _gpu(items)
    rows = plan(items, spec, gpu)
    from iotune.study.volumes import Volume

    said = [f"volume {Volume.from_json(v).describe()}" for v in spec.volumes]
    if dry_run:
        if STATE.json:
            emit_json({"out": str(out_dir), "volumes": spec.volumes, "plan": rows})
        else:
            for line in said:
                console().print(line, soft_wrap=True)
            console().print(plan_table(rows))
        return
    if not STATE.json:
        for line in said:
            click.echo(f"iotune: {line}", err=True)
        err_console().print(plan_table(rows))
        click.echo(
            f"iotune: study of {len(items)} run(s), {sum(r['fits'] for r in rows)} fit this "
            f"host; records in {out_dir}",
            err=True,
        )
    spec.save(out_dir)
    progress = (
        None
        if STATE.json
        else Progress(
            header=lambda s: click.echo(f"iotune: ── {s}", err=True),
            line=lambda s: click.echo(s, err=True),
        )
    )
    try:
        records = run_study(out_dir, spec, progress, gpu)
    except StudyInterrupted as exc:
        click.echo(f"iotune: {exc.message}", err=True)
        click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(interrupted_exit("SIGTERM" if "SIGTERM" in exc.message else "SIGINT"))
    except KeyboardInterrupt:
        click.echo(
            f"iotune: study interrupted; finished runs are in {out_dir}/runs.jsonl", err=True
        )
        click.echo(f"hint: iotune study --resume {out_dir}", err=True)
        sys.exit(130)
    failed = [r for r in records if r["status"] == "failed"]
    if STATE.json:
        emit_json({"out": str(out_dir), "volumes": spec.volumes, "plan": rows, "runs": records})
    else:
        console().print(result_table(records))
        console().print(f"records: {out_dir}/runs.jsonl; figures: iotune report {out_dir}")
    if failed:
        raise IotuneError(
            f"{len(failed)} of {len(records)} run(s) failed: "
            + ", ".join(r.get("run") or r["preset"] for r in failed),
            hint=f"their errors are in {out_dir}/runs.jsonl; each run's output in {out_dir}/runs/",
        )
