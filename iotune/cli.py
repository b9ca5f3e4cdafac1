"""The `iotune` command line. Thin: parse options, call the library, render the result."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from iotune import __version__, doctor
from iotune.errors import DeviceNotFound, IotuneError, NotRootError, UsageError
from iotune.probes.blockdev import BlockDevice, Transport, find_block_devices
from iotune.probes.host import LiveHost
from iotune.probes.sysfs import SysTree
from iotune.records import to_jsonable
from iotune.render import console, emit_json, err_console, human_bytes, warn
from iotune.units import format_size


class IotuneGroup(click.Group):
    """Every failure ends as one error line and a hint; tracebacks only with --debug."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except IotuneError as exc:
            if STATE.debug:
                traceback.print_exc()
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            click.echo(f"iotune: error: {exc.format_message()}", err=True)
            cmd = exc.ctx.command_path if exc.ctx else "iotune"
            click.echo(f"hint: '{cmd} --help' lists the commands and options", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"iotune: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("iotune: aborted", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("iotune: interrupted", err=True)
            sys.exit(130)
        except Exception as exc:  # noqa: BLE001 - last resort: one line, traceback with --debug
            if STATE.debug:
                traceback.print_exc()
            click.echo(f"iotune: internal error: {type(exc).__name__}: {exc}", err=True)
            click.echo("hint: run with --debug for the traceback, and report it", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@dataclass
class State:
    json: bool = False
    debug: bool = False


STATE = State()

STATUS_STYLE = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red"}


def json_option(f: Any) -> Any:
    def callback(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        if value:
            STATE.json = True
        return value

    return click.option(
        "--json",
        "json_out",
        is_flag=True,
        expose_value=False,
        callback=callback,
        help="Print one JSON document on stdout instead of tables.",
    )(f)


@click.group(
    cls=IotuneGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="iotune")
@click.option(
    "--json", "json_out", is_flag=True, help="Machine-readable JSON on stdout, nothing else there."
)
@click.option("--debug", is_flag=True, help="Log every external command; show tracebacks.")
@click.option("-v", "--verbose", count=True, help="More progress detail on stderr.")
def cli(json_out: bool, debug: bool, verbose: int) -> None:
    """Measure and tune NVMe offload for DeepSpeed training.

    \b
    The loop:
      iotune doctor    is this host ready? (root, BPF, headers, mdadm, fio, libaio,
                       DeepSpeed, GPU)
      iotune devices   NVMe drives: PCIe link, NUMA node, queue limits, in use or
                       free (and why)
      iotune raid      plan-then-apply mdadm RAID volumes across free NVMe drives
      iotune sweep-aio tune DeepSpeed async I/O on a volume against its fio ceiling
      iotune presets   the training experiments (1B-16B x offload strategy x
                       accumulation, and tiny CPU ones) with their estimated needs
      iotune estimate  NVMe space and bytes read/written per step, predicted
      iotune run       offloaded DeepSpeed training steps: per-step timings and
                       the study's table (space on NVMe, GB read/written, times)
      iotune trace     count every block request per drive by exact size (eBPF),
                       checked against the kernel's counters; --run PRESET traces
                       a training run

    Every command takes --json for scripts. Errors print one line and a hint;
    --debug shows the commands iotune runs and full tracebacks.
    """
    STATE.json = json_out
    STATE.debug = debug
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="iotune: %(name)s: %(message)s", stream=sys.stderr)


# --------------------------------------------------------------------------- doctor


@cli.command("doctor")
@click.option(
    "--for",
    "family",
    type=click.Choice([f.value for f in doctor.Family]),
    help="Exit non-zero unless everything this command family needs is present.",
)
@click.option("--fix", is_flag=True, help="Apply the safe fixes (mount tracefs) before checking.")
@click.option(
    "--build-ops",
    is_flag=True,
    help="Build and load DeepSpeed's async_io op now (JIT, minutes once).",
)
@json_option
def doctor_cmd(family: str | None, fix: bool, build_ops: bool) -> None:
    """Check that this host can run iotune's commands, and say how to fix what is missing.

    Each line is PASS, WARN or FAIL with what was found and the exact fix; the last lines
    say which command families (raid, sweep, trace, train) are ready. With --for FAMILY
    the exit code is 1 when something that family needs failed.
    """
    tree = SysTree("/")
    applied: list[str] = []
    if fix and doctor.tracefs_dir(tree) is None:
        if os.geteuid() != 0:
            raise NotRootError("iotune doctor --fix")
        applied.append(" ".join(doctor.fix_tracefs()))
    checks = doctor.run_checks(tree, build_ops=build_ops)
    readiness = {f.value: [c.name for c in doctor.ready(checks, f)] for f in doctor.Family}
    if STATE.json:
        emit_json(
            {
                "checks": checks,
                "ready": {k: not v for k, v in readiness.items()},
                "missing": readiness,
                "fixed": applied,
            }
        )
    else:
        con = console()
        for line in applied:
            con.print(f"applied: {line}")
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        table.add_column("CHECK")
        table.add_column("STATUS")
        table.add_column("FOUND / FIX", overflow="fold")
        for c in checks:
            text = Text(c.found)
            if c.fix and c.status is not doctor.Status.PASS:
                text.append(f"\n  fix: {c.fix}", style="cyan")
            table.add_row(c.name, Text(c.status.value, style=STATUS_STYLE[c.status.value]), text)
        con.print(table)
        con.print()
        for fam, missing in readiness.items():
            if missing:
                con.print(f"[bold red]not ready[/] for {fam}: {', '.join(missing)}")
            else:
                con.print(f"[green]ready[/] for {fam}")
    if family and readiness[family]:
        raise IotuneError(
            f"this host is not ready for '{family}': {', '.join(readiness[family])} failed",
            hint="each FAIL line above says how to fix it",
        )


# --------------------------------------------------------------------------- devices


def _state_text(d: BlockDevice) -> Text:
    if not d.in_use:
        return Text("free", style="green")
    kinds = list(dict.fromkeys(r.kind.value for r in d.in_use))
    return Text(f"in use: {', '.join(kinds)}", style="bold red")


def devices_table(devs: list[BlockDevice]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in (
        "DEVICE",
        "TRANSPORT",
        "MODEL",
        "SERIAL",
        "FW",
        "SIZE",
        "LBS/PBS",
        "PCIe LINK",
        "NUMA",
        "MAX KB (HW)",
        "NR_REQ",
        "SCHED",
        "STATE",
    ):
        table.add_column(col, overflow="fold")
    for d in devs:
        model = d.model or ("loop: " + d.backing_file if d.backing_file else "-")
        table.add_row(
            d.path,
            d.transport.value,
            model,
            d.serial or "-",
            d.firmware or "-",
            human_bytes(d.size_bytes),
            f"{d.logical_block_size}/{d.physical_block_size}",
            str(d.pcie) if d.pcie else "-",
            "-" if d.numa_node is None else str(d.numa_node),
            f"{d.queue.max_sectors_kb} ({d.queue.max_hw_sectors_kb})",
            str(d.queue.nr_requests) if d.queue.nr_requests is not None else "-",
            d.queue.scheduler or "-",
            _state_text(d),
        )
    return table


def _resolve_names(wanted: tuple[str, ...]) -> list[str]:
    names = []
    for w in wanted:
        name = w.removeprefix("/dev/")
        if os.path.islink(w):
            name = os.path.basename(os.path.realpath(w))
        if not os.path.isdir(f"/sys/block/{name}"):
            if os.path.exists(f"/sys/class/block/{name}/partition"):
                disk = Path(os.path.realpath(f"/sys/class/block/{name}")).parent.name
                raise UsageError(
                    f"{w} is a partition; iotune works on whole disks",
                    hint=f"ask for its disk: iotune devices /dev/{disk}",
                )
            raise DeviceNotFound(w)
        names.append(name)
    return names


@cli.command("devices")
@click.argument("device", nargs=-1)
@click.option(
    "--all", "show_all", is_flag=True, help="Every disk (loop, virtio, md, …), not only NVMe."
)
@json_option
def devices_cmd(device: tuple[str, ...], show_all: bool) -> None:
    """List NVMe drives (or DEVICE…, or --all disks) and whether each is in use, and why.

    In use means any of: mounted (where), has partitions, holds a filesystem/RAID/LVM
    signature (read-only wipefs probe), has holders (md, dm), is swap, backs / or /boot,
    or cannot be opened with O_EXCL. Sizes are binary (GiB); MAX KB is the queue's
    max_sectors_kb (largest request the kernel will issue) with the hardware limit.
    """
    names = _resolve_names(device)
    if os.geteuid() != 0:
        raise NotRootError("iotune devices")
    devs = find_block_devices(LiveHost())
    if names:
        devs = [d for d in devs if d.name in names]
    elif not show_all:
        others = [d.name for d in devs if d.transport is not Transport.NVME]
        devs = [d for d in devs if d.transport is Transport.NVME]
        if not devs and not STATE.json:
            listed = ", ".join(others) if others else "none"
            warn(f"no NVMe drives found (other disks: {listed}); use --all to list every disk")
    if STATE.json:
        emit_json({"devices": devs})
        return
    if devs:
        con = console()
        con.print(devices_table(devs))
        busy = [d for d in devs if d.in_use]
        if busy:
            con.print()
        for d in busy:
            con.print(f"[bold]{d.name}[/] is in use:")
            for r in d.in_use:
                con.print(f"  - {r.detail}")


# --------------------------------------------------------------------------- training-run options


def _preset_with(name: str, sets: tuple[str, ...], steps: int | None) -> Any:
    from iotune.train.presets import apply_sets, get_preset, parse_sets

    preset = get_preset(name)
    overrides = parse_sets(sets)
    if steps is not None:
        overrides["steps"] = steps
    return apply_sets(preset, overrides)


def _load_aio(path: str | None) -> tuple[dict[str, Any] | None, str]:
    """--aio-config: a `sweep-aio` run directory, its result.json, or a DeepSpeed config."""
    if path is None:
        return None, "preset"
    p = Path(path)
    f = p / "result.json" if p.is_dir() else p
    try:
        doc = json.loads(f.read_text())
    except FileNotFoundError as exc:
        raise UsageError(
            f"--aio-config {path}: no such file",
            hint="name a sweep-aio run directory or a DeepSpeed JSON config",
        ) from exc
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--aio-config {f}: not JSON ({exc.msg})", hint="name a DeepSpeed JSON config"
        ) from exc
    aio = doc.get("aio") if isinstance(doc, dict) else None
    if not isinstance(aio, dict) or not isinstance(aio.get("block_size"), int):
        raise UsageError(
            f'--aio-config {f} has no "aio" block with a block_size',
            hint="a finished 'iotune sweep-aio' run directory, or a config written by --write-config",
        )
    return aio, str(f)


def run_options(f: Any) -> Any:
    for opt in reversed(
        [
            click.option(
                "--nvme-path", type=click.Path(), help="Offload directory (default: the preset's)."
            ),
            click.option(
                "--steps",
                type=click.IntRange(1, 100000),
                help="Optimizer steps (default: the preset's).",
            ),
            click.option(
                "--set",
                "sets",
                multiple=True,
                metavar="KEY=VALUE",
                help="Override a preset field (steps, ga, seq_len, micro_batch, accelerator...), "
                "model.FIELD, or ds.a.b in the DeepSpeed config. Repeatable.",
            ),
            click.option(
                "--data",
                type=click.Path(),
                help="A local .txt, .jsonl or .parquet file (e.g. WikiText-2) tokenized and packed "
                "into seq_len blocks; default: synthetic tokens.",
            ),
            click.option(
                "--tokenizer",
                type=click.Path(),
                help="A local Hugging Face tokenizer directory for --data (default: UTF-8 bytes).",
            ),
            click.option(
                "--aio-config",
                type=click.Path(),
                help="Take the aio block from a sweep-aio run directory or a DeepSpeed config.",
            ),
            click.option(
                "--force",
                is_flag=True,
                help="Run even when the preflight estimate says it will not fit.",
            ),
            click.option(
                "--keep-swap", is_flag=True, help="Keep DeepSpeed's swap files after the run."
            ),
        ]
    ):
        f = opt(f)
    return f


def _run_preset(
    name: str,
    backend: str,
    out: str | None,
    nvme_path: str | None,
    steps: int | None,
    sets: tuple[str, ...],
    data: str | None,
    tokenizer: str | None,
    aio_config: str | None,
    force: bool,
    keep_swap: bool,
    interval: float = 1.0,
    focus: int | None = None,
) -> None:
    from iotune.train import runner as train_runner
    from iotune.train.render import print_estimate, print_run

    preset = _preset_with(name, sets, steps)
    aio, aio_source = _load_aio(aio_config)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = (Path(out) if out else Path("results") / f"run-{preset.name}-{stamp}").resolve()
    if data:
        from iotune.train.data import FORMATS

        if not Path(data).is_file():
            raise UsageError(
                f"--data {data}: no such file", hint="name a .txt, .jsonl or .parquet file"
            )
        if Path(data).suffix.lower() not in FORMATS:
            raise UsageError(
                f"--data {data}: unknown format {Path(data).suffix or '(none)'}",
                hint="use a .txt, .jsonl or .parquet file with the text",
            )
    if tokenizer and not (Path(tokenizer) / "tokenizer_config.json").is_file():
        raise UsageError(
            f"--tokenizer {tokenizer} is not a Hugging Face tokenizer directory (no tokenizer_config.json)",
            hint="save one with AutoTokenizer.from_pretrained(...).save_pretrained(DIR), or leave it out for byte tokens",
        )
    req = train_runner.RunRequest(
        preset=preset,
        out=out_dir,
        backend=backend,
        nvme_path=Path(nvme_path) if nvme_path else None,
        aio=aio,
        aio_source=aio_source,
        data=Path(data) if data else None,
        tokenizer=Path(tokenizer) if tokenizer else None,
        force=force,
        keep_swap=keep_swap,
        quiet_stdout=STATE.json,
        interval=interval,
        focus=focus,
        progress=not STATE.json,
    )
    prep = train_runner.prepare(req)
    for note in req.notes:
        warn(note)
    if not STATE.json:
        print_estimate(err_console(), prep.preset, prep.est, prep.cfg)
        what = (
            f"{', '.join(prep.targets.disks)} ({backend})"
            if prep.targets.disks
            else "no drive (no NVMe offload)"
        )
        click.echo(
            f"iotune: running {preset.name} for {preset.steps} steps, tracing {what}; results in {out_dir}",
            err=True,
        )
    result = train_runner.run(req, prep)
    if STATE.json:
        emit_json(result)
    else:
        print_run(console(), result)
    if result["interrupted"]:
        click.echo(
            f"iotune: interrupted ({result['interrupted']}) after {result['steps_done']} step(s); "
            f"records kept in {result['out']}",
            err=True,
        )
        sys.exit(130 if result["interrupted"] == "SIGINT" else 143)
    code = result["exit_code"]
    if code:
        click.echo(
            f"iotune: the training worker failed (exit {code}) after {result['steps_done']} step(s)",
            err=True,
        )
        click.echo("hint: its output is above; rerun with --debug for iotune's own log", err=True)
        sys.exit(code if code > 0 else 128 - code)


# --------------------------------------------------------------------------- trace


def _pick_backend(backend: str) -> str:
    if backend != "auto":
        if backend == "bcc" and os.geteuid() != 0:
            raise NotRootError("iotune trace --backend bcc")
        if backend == "bcc":
            tp = doctor.check_block_tracepoint(SysTree("/"))
            if tp.status is doctor.Status.FAIL:
                raise IotuneError(
                    f"cannot trace with bcc: {tp.found}", hint=tp.fix or "use --backend diskstats"
                )
        return backend
    tree = SysTree("/")
    problems = []
    if os.geteuid() != 0:
        problems.append("not root")
    if doctor.tracefs_dir(tree) is None:
        problems.append("tracefs not mounted")
    if doctor.check_bcc().status is doctor.Status.FAIL:
        problems.append("bcc not importable")
    tp = doctor.check_block_tracepoint(tree)
    if tp.status is doctor.Status.FAIL and doctor.tracefs_dir(tree) is not None:
        problems.append(tp.found)  # e.g. a kernel whose block_rq_issue lacks the bytes field
    if problems:
        warn(
            f"using the diskstats backend ({', '.join(problems)}): totals per drive only, "
            "no request sizes, no focus/other split; 'iotune doctor --for trace' says what to fix"
        )
        return "diskstats"
    return "bcc"


@cli.command(
    "trace",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--duration", type=float, help="Trace for S seconds (no workload).")
@click.option(
    "--devices",
    "device_list",
    help="Comma-separated drives: nvme0n1,nvme1n1 (md arrays expand to members).",
)
@click.option(
    "--target",
    type=click.Path(),
    help="Trace the drives behind PATH (file, directory, partition, md array).",
)
@click.option(
    "--focus-size",
    default="512K",
    show_default=True,
    help="The request size counted apart (DeepSpeed's AIO block_size).",
)
@click.option(
    "--interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between samples of the counters.",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "bcc", "diskstats"]),
    default="auto",
    show_default=True,
    help="bcc: exact sizes via eBPF; diskstats: kernel totals only.",
)
@click.option("--out", type=click.Path(), help="Run directory (default results/trace-DATE-TIME).")
@click.option(
    "--run",
    "run_preset",
    metavar="PRESET",
    help="Trace an offloaded training run of PRESET (see 'iotune presets list').",
)
@run_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@json_option
def trace_cmd(
    duration: float | None,
    device_list: str | None,
    target: str | None,
    focus_size: str,
    interval: float,
    backend: str,
    out: str | None,
    run_preset: str | None,
    command: tuple[str, ...],
    **run_kw: Any,
) -> None:
    """Count every block request per drive, by exact size, while COMMAND runs (or for --duration),
    or during an offloaded training run (--run PRESET).

    \b
    iotune trace --run tiny_opt_nvme --steps 3
    iotune trace --run opt_nvme_16b --nvme-path /mnt/offload
    iotune trace --devices nvme0n1 --duration 30
    iotune trace --target /mnt/offload -- python train.py
    iotune trace --devices loop0 --focus-size 512K -- fio job.fio

    With --run, the drives behind the preset's offload directory are traced,
    the focus size is the preset's AIO block size, every optimizer step gets
    its own figures, and the study's table is printed with the I/O model's
    prediction beside the measurement ('iotune run --help' for the options).

    Requests are counted at block:block_rq_issue, after merging and splitting: what the
    drive is asked to do. Read/write requests of exactly --focus-size are counted apart
    from all other sizes. Every drive is checked against the kernel's own counters
    (/sys/block/DEV/stat). md arrays issue their requests on their members: each member is
    reported and the array is their sum. The exit code is COMMAND's.
    """
    from pathlib import Path as _P

    from iotune.trace.render import print_details, print_steps, summary_table
    from iotune.trace.runner import Tracer, TraceRequest
    from iotune.trace.targets import Targets, resolve_devices, resolve_path
    from iotune.units import parse_size

    if run_preset:
        if command or duration is not None or device_list or target:
            raise UsageError(
                "--run traces the drives behind the preset's offload directory: drop --duration, "
                "--devices, --target and the command",
                hint="iotune trace --run tiny_opt_nvme --nvme-path /var/tmp/offload",
            )
        ctx = click.get_current_context()
        focus_given = (
            ctx.get_parameter_source("focus_size") == click.core.ParameterSource.COMMANDLINE
        )
        if interval <= 0:
            raise UsageError(
                f"--interval must be positive, got {interval:g}", hint="e.g. --interval 1"
            )
        _run_preset(
            run_preset,
            _pick_backend(backend),
            out,
            interval=interval,
            focus=parse_size(focus_size, what="--focus-size") if focus_given else None,
            **run_kw,
        )
        return
    given = [k for k, v in run_kw.items() if v not in (None, False, ())]
    if given:
        raise UsageError(
            f"--{given[0].replace('_', '-')} belongs to --run PRESET",
            hint="iotune trace --run tiny_opt_nvme --steps 3",
        )
    focus = parse_size(focus_size, what="--focus-size")
    if interval <= 0:
        raise UsageError(f"--interval must be positive, got {interval:g}", hint="e.g. --interval 1")
    if duration is not None and duration <= 0:
        raise UsageError(
            f"--duration must be positive, got {duration:g}", hint="e.g. --duration 30"
        )
    if bool(command) == (duration is not None):
        raise UsageError(
            "say what to trace: --duration S, or a command after --",
            hint="iotune trace --devices nvme0n1 -- fio job.fio",
        )
    tree = SysTree("/")
    targets = Targets(disks=())
    if device_list:
        targets = resolve_devices(tree, device_list.split(","))
    if target:
        t = resolve_path(tree, target)
        targets = Targets(
            disks=tuple(dict.fromkeys([*targets.disks, *t.disks])),
            arrays=targets.arrays + t.arrays,
            stacked=tuple(dict.fromkeys([*targets.stacked, *t.stacked])),
        )
    if not targets.disks:
        nvme = [d for d in tree.listdir("/sys/block") if d.startswith("nvme")]
        if not nvme:
            raise UsageError(
                "no drives to trace: this host has no NVMe drives",
                hint="name drives with --devices loop0,vda or a path with --target",
            )
        targets = resolve_devices(tree, nvme)
    chosen = _pick_backend(backend)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = _P(out) if out else _P("results") / f"trace-{stamp}"
    req = TraceRequest(
        targets=targets,
        backend=chosen,
        focus=focus,
        interval=interval,
        out=out_dir.resolve(),
        duration=duration,
        command=list(command) or None,
        quiet_stdout=STATE.json,
    )
    if not STATE.json:
        what = " ".join(command) if command else f"{duration:g} s"
        click.echo(f"iotune: tracing {', '.join(targets.disks)} ({chosen}) during {what}", err=True)
    try:
        result = Tracer(req).run()
    except KeyboardInterrupt:
        click.echo("iotune: interrupted before the first sample; nothing recorded", err=True)
        sys.exit(130)
    if STATE.json:
        emit_json(result)
    else:
        con = console()
        con.print(summary_table(result))
        con.print()
        print_details(con, result)
        print_steps(con, result)
        if result["dropped"]["sizes"] or result["dropped"]["hist"]:
            warn(f"BPF maps were full: {result['dropped']} requests not counted")
        con.print(f"results: {result['out']}")
    if result["interrupted"]:
        click.echo(
            f"iotune: interrupted ({result['interrupted']}); partial results in {result['out']}",
            err=True,
        )
        sys.exit(130 if result["interrupted"] == "SIGINT" else 143)
    code = result["exit_code"]
    if code:
        sys.exit(code if code > 0 else 128 - code)


# --------------------------------------------------------------------------- presets, estimate, run


@cli.group("presets", invoke_without_command=True)
@click.pass_context
def presets_group(ctx: click.Context) -> None:
    """The training presets: the study's experiments and small CPU ones (configs/presets.toml).

    \b
    iotune presets list              every preset with parameters and estimated needs
    iotune presets show opt_nvme_16b one preset: geometry, DeepSpeed config, I/O model
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(presets_list)


@presets_group.command("list")
@click.option("--strategy", help="Only this strategy (e.g. opt_nvme).")
@click.option("--size", help="Only this size (e.g. 16b, tiny).")
@json_option
def presets_list(strategy: str | None, size: str | None) -> None:
    """Every preset: parameter count, geometry, strategy, accumulation and estimated needs."""
    from iotune.train.estimate import estimate
    from iotune.train.presets import ds_config, load_presets
    from iotune.train.render import presets_table

    rows = []
    for p in load_presets().values():
        if (strategy and p.strategy.name != strategy) or (size and p.size != size):
            continue
        rows.append((p, estimate(p, ds_config(p))))
    if not rows:
        raise UsageError(
            "no preset matches", hint="'iotune presets list' without filters shows them all"
        )
    if STATE.json:
        emit_json(
            [
                {
                    "name": p.name,
                    "size": p.size,
                    "strategy": p.strategy.name,
                    "params": e.params,
                    "geometry": p.geometry.llama_config(),
                    "ga": p.ga,
                    "seq_len": p.seq_len,
                    "accelerator": p.accelerator,
                    "nvme_bytes": e.nvme_bytes,
                    "gpu_bytes": e.gpu_bytes,
                    "host_bytes": e.host_bytes,
                }
                for p, e in rows
            ]
        )
    else:
        console().print(presets_table(rows))


@presets_group.command("show")
@click.argument("name")
@click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Overrides, as for 'iotune run'."
)
@json_option
def presets_show(name: str, sets: tuple[str, ...]) -> None:
    """One preset: geometry, parameter count, the DeepSpeed config it runs with, its I/O model."""
    from dataclasses import asdict

    from iotune.train.estimate import estimate
    from iotune.train.presets import ds_config
    from iotune.train.render import print_estimate

    p = _preset_with(name, sets, None)
    cfg = ds_config(p)
    e = estimate(p, cfg)
    if STATE.json:
        emit_json(
            {"preset": asdict(p), "params": e.params, "ds_config": cfg, "estimate": asdict(e)}
        )
        return
    con = console()
    print_estimate(con, p, e, cfg)
    con.print("DeepSpeed config:")
    con.print_json(json.dumps(cfg))


@cli.command("estimate")
@click.argument("preset")
@click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Overrides, as for 'iotune run'."
)
@click.option(
    "--aio-config", type=click.Path(), help="aio block from a sweep-aio run or a DeepSpeed config."
)
@json_option
def estimate_cmd(preset: str, sets: tuple[str, ...], aio_config: str | None) -> None:
    """Predict NVMe space and bytes read/written per step for PRESET, from DeepSpeed's swap logic.

    \b
    With N parameters and the optimizer state on NVMe: footprint 16N bytes,
    initialisation + first step reads 12N and writes 24N, each later step
    reads 16N and writes 16N. Parameter offload adds 2N of bf16 files and the
    parameter fetches of forward, recomputation and backward. Tensors under
    max(1 MiB, aio block) stay in RAM, which matters only for small models.
    'iotune trace --run PRESET' prints this prediction next to the measurement.
    """
    from dataclasses import asdict

    from iotune.train.estimate import estimate
    from iotune.train.presets import ds_config
    from iotune.train.render import print_estimate

    p = _preset_with(preset, sets, None)
    aio, _ = _load_aio(aio_config)
    cfg = ds_config(p, aio=aio)
    e = estimate(p, cfg)
    if STATE.json:
        emit_json(
            {"preset": p.name, "params": e.params, **asdict(e), "init_first": asdict(e.init_first)}
        )
    else:
        print_estimate(console(), p, e, cfg)


@cli.command("run")
@click.argument("preset")
@run_options
@click.option(
    "--out", type=click.Path(), help="Run directory (default results/run-PRESET-DATE-TIME)."
)
@json_option
def run_cmd(preset: str, out: str | None, **kw: Any) -> None:
    """Run DeepSpeed-offloaded training steps of PRESET and print the study's table.

    \b
    iotune run tiny_opt_nvme                        # CPU-only host, any drive
    iotune run opt_nvme_1b --nvme-path /mnt/nvme0 --steps 5
    iotune run opt_raid0_3b_ga8 --aio-config results/sweep-...

    Before anything is allocated, the preset's GPU memory, host RAM and NVMe
    space are estimated and the run is refused if they do not fit (--force
    runs anyway). The worker reports every step (forward, backward, optimizer,
    tokens/s, loss, peak memory); the drives behind the offload path are
    measured with the kernel's counters. 'iotune trace --run PRESET' does the
    same with eBPF request sizes.
    """
    _run_preset(preset, "diskstats", out, **kw)


# --------------------------------------------------------------------------- raid


@cli.group("raid")
def raid_group() -> None:
    """Build, inspect and remove mdadm volumes across NVMe drives, plan first.

    \b
    iotune raid create --all-unused --dry-run          show the plan for RAID0 over every free drive
    iotune raid create --layout raid/offload-raid0.toml
    iotune raid status
    iotune raid destroy offload

    Every change is printed as a plan (each command line and why) and applied only
    after confirmation (or --yes); a drive that is in use is never touched.
    """


def _load_layout(path: str) -> dict[str, Any]:
    import tomllib

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError as exc:
        raise UsageError(f"layout {path} does not exist", hint="see raid/*.toml") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"layout {path} is not valid TOML: {exc}", hint="see raid/*.toml") from exc
    allowed = {"name", "level", "chunk", "fs", "mount", "persist", "all_unused", "devices", "wipe"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise UsageError(
            f"layout {path}: unknown key(s) {', '.join(unknown)}",
            hint=f"keys: {', '.join(sorted(allowed))}",
        )
    return data


def _print_plan(plan: Any, disks: dict[str, BlockDevice]) -> None:
    con = console()
    req = plan.request
    con.print(f"[bold]Plan:[/] RAID{req.level} {plan.device} over {len(plan.members)} drives")
    for m in plan.members:
        d = disks.get(m.removeprefix("/dev/"))
        ident = [x for x in (d.model, d.serial, human_bytes(d.size_bytes)) if x] if d else []
        con.print(f"  member {m} ({', '.join(ident)})")
    chunk = "" if req.level == 1 else f", chunk {format_size(req.chunk)}"
    con.print(
        f"  capacity ≈ {human_bytes(plan.capacity_bytes)} ({plan.data_disks} data disk(s){chunk})"
    )
    if plan.alignment:
        con.print(f"  filesystem alignment: {req.fs.value} {plan.alignment}")
    for i, step in enumerate(plan.steps, 1):
        con.print(f"  {i}. {step.describe()}", soft_wrap=True)
        con.print(f"     [dim]why: {step.why}[/]")
    for n in plan.notes:
        con.print(f"  note: {n}")


def _confirm(yes: bool, what: str) -> None:
    if yes:
        return
    try:
        ok = click.confirm(f"{what}?", default=False, err=True)
    except click.Abort:
        ok = False
    if not ok:
        raise IotuneError("not confirmed: nothing was changed", hint="--yes applies without asking")


def _ensure_md(level: int) -> None:
    from iotune import proc

    module = {0: "raid0", 1: "raid1", 5: "raid456", 6: "raid456", 10: "raid10"}[level]
    proc.run(["modprobe", module], check=False, timeout=60)
    personality = {5: "raid5", 6: "raid6"}.get(level, module)
    mdstat = SysTree("/").read("/proc/mdstat") or ""
    if f"[{personality}]" not in mdstat:
        raise IotuneError(
            f"the running kernel has no md {personality} driver",
            hint="'iotune doctor --for raid' says what is missing",
        )


@raid_group.command("create")
@click.argument("devices", nargs=-1)
@click.option("--all-unused", is_flag=True, help="Every NVMe drive that is not in use.")
@click.option(
    "--level", type=click.Choice(["0", "1", "5", "6", "10"]), default="0", show_default=True
)
@click.option("--chunk", default="512K", show_default=True, help="Stripe chunk per drive.")
@click.option("--name", default="offload", show_default=True, help="Array name: /dev/md/NAME.")
@click.option("--fs", type=click.Choice(["xfs", "ext4", "none"]), default="xfs", show_default=True)
@click.option("--mount", "mountpoint", help="Mount the filesystem here (noatime).")
@click.option(
    "--persist", is_flag=True, help="mdadm.conf ARRAY line, initramfs update, fstab entry by UUID."
)
@click.option("--layout", type=click.Path(), help="A layout file (raid/*.toml); flags override it.")
@click.option(
    "--wipe",
    is_flag=True,
    help="Erase existing signatures on the members (never on a drive in use).",
)
@click.option(
    "--mkfs-opt", "mkfs_opts", multiple=True, help="Extra option passed to mkfs (repeatable)."
)
@click.option("--dry-run", is_flag=True, help="Print the plan and stop.")
@click.option("--yes", is_flag=True, help="Apply without asking.")
@json_option
def raid_create(
    devices: tuple[str, ...],
    all_unused: bool,
    level: str,
    chunk: str,
    name: str,
    fs: str,
    mountpoint: str | None,
    persist: bool,
    layout: str | None,
    wipe: bool,
    mkfs_opts: tuple[str, ...],
    dry_run: bool,
    yes: bool,
) -> None:
    """Plan, confirm and build an md RAID volume (RAID0 by default) with a filesystem.

    The plan lists each command line and why: wipefs (only with --wipe), mdadm --create,
    mkfs aligned to the stripe, mount, and with --persist the mdadm.conf, initramfs and
    fstab entries. A drive that is mounted, has partitions, holds any signature, has
    holders, is swap, backs / or /boot, cannot be opened O_EXCL, is not a whole disk or is
    tiny next to the others is refused, with every reason, before anything is touched.
    If a step fails, what was created is removed again. Re-running the same create on a
    matching array changes nothing.
    """
    from iotune.raid import apply as raid_apply
    from iotune.raid.host import array_info, find_array, host_setup, new_uuids
    from iotune.raid.model import Fs, RaidRequest
    from iotune.raid.plan import choose_unused, plan_create
    from iotune.units import parse_size

    ctx = click.get_current_context()
    given = {
        p
        for p in ctx.params
        if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE
    }
    spec: dict[str, Any] = _load_layout(layout) if layout else {}
    if "level" in given or "level" not in spec:
        spec["level"] = int(level)
    for key, value in (("chunk", chunk), ("name", name), ("fs", fs), ("mount", mountpoint)):
        opt = {"mount": "mountpoint"}.get(key, key)
        if opt in given or key not in spec:
            spec[key] = value
    spec["persist"] = persist or bool(spec.get("persist", False))
    spec["wipe"] = wipe or bool(spec.get("wipe", False))
    if devices:
        spec["devices"], spec["all_unused"] = list(devices), False
    elif all_unused:
        spec["all_unused"] = True
    try:
        req = RaidRequest(
            name=str(spec["name"]),
            level=int(spec["level"]),
            chunk=parse_size(str(spec["chunk"]), what="chunk"),
            devices=tuple(str(d) for d in spec.get("devices", [])),
            all_unused=bool(spec.get("all_unused", False)),
            fs=Fs(str(spec["fs"])),
            mount=str(spec["mount"]) if spec.get("mount") else None,
            persist=bool(spec["persist"]),
            wipe=bool(spec["wipe"]),
            mkfs_options=mkfs_opts,
        )
    except ValueError as exc:
        raise UsageError(f"bad layout value: {exc}", hint="see raid/*.toml") from exc
    if not req.devices and not req.all_unused:
        raise UsageError(
            "name the drives, or --all-unused", hint="iotune raid create nvme0n1 nvme1n1 nvme2n1"
        )
    if os.geteuid() != 0:
        raise NotRootError("iotune raid create")
    host = LiveHost()
    all_disks = find_block_devices(host)
    by_name = {d.name: d for d in all_disks}
    existing = find_array(host, req.name)
    if existing:
        info = array_info(host, existing)
        want = sorted(_resolve_names(req.devices)) if req.devices else None
        have = sorted(m["device"].removeprefix("/dev/") for m in info.members if m["device"])
        same = (
            info.level == f"raid{req.level}"
            and (req.level == 1 or info.chunk_bytes == req.chunk)
            and (want is None or want == have)
        )
        if not same:
            raise UsageError(
                f"an array named {req.name!r} already exists ({info.level}, members "
                f"{', '.join(have)}) and differs from this request",
                hint=f"pick another --name, or 'iotune raid destroy {req.name}' first",
            )
        if STATE.json:
            emit_json({"plan": None, "exists": info, "changed": False})
        else:
            console().print(
                f"{info.device} already exists as asked ({info.level}, {', '.join(have)}): nothing to do"
            )
        return
    if req.all_unused:
        chosen = choose_unused(all_disks)
        if not chosen:
            raise UsageError(
                "no free NVMe drives", hint="'iotune devices' shows why each drive is in use"
            )
    else:
        names = _resolve_names(req.devices)
        missing = [n for n in names if n not in by_name]
        if missing:
            raise DeviceNotFound(missing[0])
        chosen = [by_name[n] for n in names]
    from iotune.probes.mounts import read_mounts

    mounted = [m.mountpoint for m in read_mounts(host.tree)]
    plan = plan_create(chosen, req, host_setup(), new_uuids(), mounted_paths=mounted)
    if STATE.json and (dry_run or not yes):
        emit_json({"plan": plan, "applied": False})
    elif not STATE.json:
        _print_plan(plan, by_name)
    if dry_run:
        return
    _confirm(yes, f"Build {plan.device}")
    _ensure_md(req.level)

    def progress(i: int, step: Any) -> None:
        if not STATE.json:
            click.echo(f"[{i + 1}/{len(plan.steps)}] {step.describe()}", err=True)

    raid_apply.apply_create(plan, host.tree, on_step=progress)
    info = array_info(LiveHost(), raid_apply.kernel_name(plan.device))
    if STATE.json:
        emit_json({"plan": plan, "applied": True, "array": info})
    else:
        where = f", mounted at {', '.join(info.mountpoints)}" if info.mountpoints else ""
        console().print(
            f"built {plan.device} ({info.level}, {human_bytes(info.size_bytes)}{where})"
        )


@raid_group.command("status")
@click.argument("name", required=False)
@json_option
def raid_status(name: str | None) -> None:
    """md arrays: level, chunk, members (drive model/serial), state, size, filesystem, mount
    point, and the queue limits the array passes down (max_sectors_kb, minimum/optimal I/O)."""
    from iotune.raid.host import array_info, find_array, list_arrays

    host = LiveHost()
    if name:
        md = find_array(host, name)
        if md is None:
            raise UsageError(
                f"no md array named {name!r}", hint="'iotune raid status' lists them all"
            )
        arrays = [array_info(host, md)]
    else:
        arrays = list_arrays(host)
    if STATE.json:
        emit_json({"arrays": arrays})
        return
    if not arrays:
        console().print("no md arrays")
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in (
        "ARRAY",
        "LEVEL",
        "CHUNK",
        "STATE",
        "SIZE",
        "FS",
        "MOUNT",
        "MAX KB",
        "MIN/OPT IO",
        "MEMBERS",
    ):
        table.add_column(col)
    for a in arrays:
        members = "\n".join(
            f"{m['device']} {m['model'] or ''} {m['serial'] or ''}".strip() for m in a.members
        )
        sync = (
            f" ({a.sync_action} {a.sync_completed})" if a.sync_action not in (None, "idle") else ""
        )
        table.add_row(
            f"{a.device} ({a.kernel_name})",
            a.level or "-",
            format_size(a.chunk_bytes) if a.chunk_bytes else "-",
            (a.state or "-") + sync,
            human_bytes(a.size_bytes),
            a.fs or "-",
            ", ".join(a.mountpoints) or "-",
            str(a.max_sectors_kb),
            f"{a.minimum_io_size}/{a.optimal_io_size}",
            members,
        )
    console().print(table)


@raid_group.command("destroy")
@click.argument("name")
@click.option(
    "--wipe-members", is_flag=True, help="Also erase every remaining signature on the members."
)
@click.option("--dry-run", is_flag=True, help="Print the plan and stop.")
@click.option("--yes", is_flag=True, help="Apply without asking.")
@json_option
def raid_destroy(name: str, wipe_members: bool, dry_run: bool, yes: bool) -> None:
    """Plan, confirm and remove an array: unmount, drop its fstab and mdadm.conf entries,
    stop it, zero the members' superblocks. Refused while anything uses the volume."""
    from iotune.raid import apply as raid_apply
    from iotune.raid.host import array_facts, find_array, host_setup
    from iotune.raid.plan import plan_destroy

    if os.geteuid() != 0:
        raise NotRootError("iotune raid destroy")
    host = LiveHost()
    md = find_array(host, name)
    if md is None:
        raise UsageError(f"no md array named {name!r}", hint="'iotune raid status' lists them all")
    setup = host_setup()
    facts = array_facts(host, md, setup)
    steps = plan_destroy(facts, wipe_members=wipe_members, setup=setup)
    if STATE.json and (dry_run or not yes):
        emit_json({"plan": steps, "applied": False})
    elif not STATE.json:
        con = console()
        con.print(
            f"[bold]Plan:[/] destroy {facts.device} ({md}, members {', '.join(facts.members)})"
        )
        for i, step in enumerate(steps, 1):
            con.print(f"  {i}. {step.describe()}", soft_wrap=True)
            con.print(f"     [dim]why: {step.why}[/]")
    if dry_run:
        return
    _confirm(yes, f"Destroy {facts.device}")

    def progress(i: int, step: Any) -> None:
        if not STATE.json:
            click.echo(f"[{i + 1}/{len(steps)}] {step.describe()}", err=True)

    raid_apply.apply_steps(steps, on_step=progress)
    if STATE.json:
        emit_json({"plan": steps, "applied": True})
    else:
        console().print(f"destroyed {facts.device}; members {', '.join(facts.members)} are free")


# --------------------------------------------------------------------------- sweep


def _list(text: str, parse: Any, what: str) -> tuple[Any, ...]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"{what}: give at least one value", hint=f"e.g. {what} 1,2,4")
    return tuple(dict.fromkeys(parse(t) for t in items))


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise UsageError(f"{text!r} is not true or false", hint="e.g. --single-submit false,true")


def _posint(what: str) -> Any:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) <= 0:
            raise UsageError(
                f"{what}: {text!r} is not a positive whole number", hint=f"e.g. {what} 4,8,16"
            )
        return int(text)

    return parse


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


@cli.command("sweep-aio")
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


@cli.command("sweep-threads")
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


# --------------------------------------------------------------------------- entry point


def main() -> None:
    """Console entry point (``iotune``)."""
    cli()
