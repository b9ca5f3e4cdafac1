"""`iotune trace`: per-request size accounting per drive, during a command or a training run."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import click

from iotune import doctor
from iotune.cli.options import (
    STATE,
    _run_preset,
    json_option,
    run_options,
)
from iotune.errors import IotuneError, NotRootError, UsageError
from iotune.probes.sysfs import SysTree
from iotune.render import console, emit_json, warn


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


@click.command(
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
