"""`iotune trace`: per-request size accounting per drive, during a command or a training run.

Which drives (named, behind a path, or every NVMe drive) and which backend (bcc or
diskstats) are decided in :mod:`iotune.trace`; this module checks the option combinations,
runs the tracer and renders.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from iotune.cli.options import (
    STATE,
    exit_if_path_lost,
    interrupted_exit,
    json_option,
    run_options,
    workload_exit,
    workload_failed,
)
from iotune.cli.running import run_preset
from iotune.errors import UsageError
from iotune.probes.sysfs import SysTree
from iotune.render import console, emit_json, warn

if TYPE_CHECKING:
    from iotune.trace.request import TraceRequest


def backend_for(requested: str) -> str:
    from iotune.trace.backend import choose_backend

    choice = choose_backend(requested, SysTree("/"), is_root=os.geteuid() == 0)
    for line in (choice.warning, choice.note):
        if line:
            warn(line)
    return choice.backend


def _positive_interval(interval: float) -> None:
    if interval <= 0:
        raise UsageError(f"--interval must be positive, got {interval:g}", hint="e.g. --interval 1")


def _trace_run(
    preset: str | None,
    workload_given: bool,
    focus_size: str,
    interval: float,
    backend: str,
    **kw: Any,
) -> None:
    """--run PRESET: the drives behind the preset's offload directory, during its training."""
    from iotune.units import parse_size

    if workload_given:
        raise UsageError(
            "--run traces the drives behind the preset's offload directory: drop --duration, "
            "--devices, --target and the command",
            hint="iotune trace --run tiny_opt_nvme --nvme-path /var/tmp/offload",
        )
    ctx = click.get_current_context()
    focus_given = ctx.get_parameter_source("focus_size") == click.core.ParameterSource.COMMANDLINE
    _positive_interval(interval)
    run_preset(
        preset,
        backend_for(backend),
        interval=interval,
        focus=parse_size(focus_size, what="--focus-size") if focus_given else None,
        **kw,
    )


def _given(param: str) -> bool:
    ctx = click.get_current_context()
    return ctx.get_parameter_source(param) == click.core.ParameterSource.COMMANDLINE


#: the options a traced script of your own takes (--model, --ds-config and the batch)
SCRIPT_KEYS = ("model", "ds_config", "micro_batch", "seq_len", "ga", "sets", "ranks")


def _script_plan(run_kw: dict[str, Any], device_list: str | None, target: str | None) -> Any:
    """COMMAND is your own training script: the estimate of its model and config, the
    drives behind the config's nvme_path (unless --devices/--target say), its aio block."""
    from iotune.train.script import plan_script

    return plan_script(
        run_kw.get("model"),
        run_kw.get("ds_config"),
        micro_batch=run_kw.get("micro_batch"),
        seq_len=run_kw.get("seq_len"),
        ga=run_kw.get("ga"),
        ranks=run_kw.get("ranks"),
        sets=tuple(run_kw.get("sets") or ()),
        devices=device_list,
        target=target,
    )


def _workload_focus(
    run_kw: dict[str, Any],
    focus_size: str,
    interval: float,
    duration: float | None,
    command: tuple[str, ...],
) -> int:
    """Without --run: no training options, sane numbers, exactly one of --duration and a
    command. Returns the focus size in bytes."""
    from iotune.units import parse_size

    given = [k for k, v in run_kw.items() if v not in (None, False, ()) and _given(k)]
    if given:
        raise UsageError(
            f"--{given[0].replace('_', '-')} belongs to --run PRESET",
            hint="iotune trace --run tiny_opt_nvme --steps 3",
        )
    focus = parse_size(focus_size, what="--focus-size")
    _positive_interval(interval)
    if duration is not None and duration <= 0:
        raise UsageError(
            f"--duration must be positive, got {duration:g}", hint="e.g. --duration 30"
        )
    if command and duration is not None:
        # a command ends the trace when it exits: a duration would be a second end
        raise UsageError(
            f"--duration {duration:g} and a command both say when the trace ends: give one",
            hint="iotune trace --devices nvme0n1 -- fio job.fio (until it exits), "
            "or iotune trace --devices nvme0n1 --duration 30",
        )
    if not command and duration is None:
        raise UsageError(
            "say what to trace: --duration S, or a command after --",
            hint="iotune trace --devices nvme0n1 -- fio job.fio",
        )
    return focus


def _request(
    device_list: str | None,
    target: str | None,
    backend: str,
    focus: int,
    interval: float,
    out: str | None,
    duration: float | None,
    command: tuple[str, ...],
    latency: bool = True,
    pid: int | None = None,
    cgroup: str | None = None,
) -> TraceRequest:
    """The drives and the backend, as a tracer's request; says on stderr what is traced."""
    from iotune.trace import only
    from iotune.trace.request import TraceRequest
    from iotune.trace.targets import select

    if pid is not None and cgroup is not None:
        raise UsageError("--pid and --cgroup are two filters: name one", hint="e.g. --pid 4242")
    if pid is not None and command:
        raise UsageError(
            "--pid names a running process, not a COMMAND's",
            hint="trace it with --duration S, or run the COMMAND under --cgroup PATH",
        )
    if pid is not None:
        only.check_pid(pid)
    if cgroup is not None:
        only.cgroup_dir(cgroup)
    targets = select(SysTree("/"), device_list, target)
    chosen = backend_for(backend)
    out_dir = Path(out) if out else Path("results") / f"trace-{time.strftime('%Y%m%d-%H%M%S')}"
    if not STATE.json:
        what = " ".join(command) if command else f"{duration:g} s"
        whose = f", only pid {pid}'s requests" if pid else ""
        whose += f", only cgroup {cgroup}'s requests" if cgroup else ""
        click.echo(
            f"iotune: tracing {', '.join(targets.disks)} ({chosen}{whose}) during {what}", err=True
        )
    return TraceRequest(
        targets=targets,
        backend=chosen,
        focus=focus,
        interval=interval,
        out=out_dir.resolve(),
        duration=duration,
        command=list(command) or None,
        quiet_stdout=STATE.json,
        latency=latency,
        only_pid=pid,
        only_cgroup=cgroup,
        meta={"only": only.describe(pid, cgroup)},
    )


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
    type=click.Choice(["auto", "libbpf", "bcc", "diskstats"]),
    default="auto",
    show_default=True,
    help="libbpf: exact sizes via eBPF (CO-RE, kernel BTF); bcc: the same, compiled at start; "
    "diskstats: kernel totals only; auto: the first that works here.",
)
@click.option(
    "--latency/--no-latency",
    default=True,
    show_default=True,
    help="Time each request (p50/p99 per drive and step) and count the drives' queue depth; "
    "--no-latency counts sizes only, at less cost per request.",
)
@click.option(
    "--pid",
    type=int,
    help="Count only the requests of process PID and the processes it starts, from any of "
    "its threads (a drive shared with others; BTF tracepoints).",
)
@click.option(
    "--cgroup",
    metavar="PATH",
    help="Count only the requests of the processes in the cgroup v2 at PATH and in the "
    "cgroups below it.",
)
@click.option(
    "--learn/--no-learn",
    default=True,
    show_default=True,
    help="With a COMMAND: learn the DeepSpeed config, world size, batch and model from the "
    "command's own Python processes (iotune's sitecustomize first on its PYTHONPATH) and put "
    "the estimate beside each step; --no-learn leaves its environment as it is.",
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
    latency: bool,
    pid: int | None,
    cgroup: str | None,
    learn: bool,
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
    iotune trace --target /mnt/offload -- deepspeed train.py
    iotune trace --model ./my-model --ds-config ds.json --steps 3
    iotune trace --model ./my-model --ds-config ds.json -- deepspeed train.py
    iotune trace --devices loop0 --focus-size 512K -- fio job.fio

    A COMMAND that trains with DeepSpeed (your own script, under any launcher) tells
    iotune its resolved config, world size, batch, dtype and model from its own processes:
    each step is cut where DeepSpeed rewrites its optimizer (or parameter) swap files, and
    the estimate of what it ran is printed beside every step. With --model DIR --ds-config
    FILE too, the drives behind the config's nvme_path are traced, the focus size is its
    aio block, and a figure the run used otherwise is named in one line. Without a
    COMMAND, iotune's own training worker runs that model and config (as --run does).

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
    from iotune.trace.render import print_trace
    from iotune.trace.runner import Tracer

    custom = bool(run_kw.get("model") or run_kw.get("ds_config"))
    if run_preset or (custom and not command):
        workload = bool(command) or duration is not None or bool(device_list or target)
        if not latency or pid is not None or cgroup is not None:
            raise UsageError(
                "--no-latency, --pid and --cgroup are for a trace of drives or a command, "
                "not of --run",
                hint="iotune trace --devices nvme0n1 --pid 4242 --duration 30",
            )
        _trace_run(run_preset, workload, focus_size, interval, backend, out=out, **run_kw)
        return
    script = None
    if custom:
        script = _script_plan(run_kw, device_list, target)
        from iotune.train.script import check_script_writer

        check_script_writer(script.preset.deepspeed, command)
        device_list, target = script.devices, script.target
        run_kw = {k: v for k, v in run_kw.items() if k not in SCRIPT_KEYS}
    focus = _workload_focus(run_kw, focus_size, interval, duration, command)
    if script is not None and not _given("focus_size"):
        focus = script.focus
    if script is None and command and learn:
        from iotune.train.script import plan_learning

        script = plan_learning(device_list, target, focus)
        script.focus_known = _given("focus_size")
    if script is not None:
        script.learn = learn
    req = _request(
        device_list, target, backend, focus, interval, out, duration, command, latency, pid, cgroup
    )
    try:
        result = script.trace(req) if script is not None else Tracer(req).run()
    except KeyboardInterrupt:
        click.echo("iotune: interrupted before the first sample; nothing recorded", err=True)
        sys.exit(130)
    if STATE.json:
        emit_json(result)
    else:
        print_trace(console(), result)
        from iotune.train.script import print_learned, print_run, print_script

        if result.get("learned"):
            print_run(console(), result["learned"])
        if result.get("script"):
            print_script(console(), result["script"])
        if result.get("learned"):
            print_learned(console(), result["learned"])
    exit_if_path_lost(result)
    if result["interrupted"]:
        click.echo(
            f"iotune: interrupted ({result['interrupted']}); partial results in {result['out']}",
            err=True,
        )
        sys.exit(interrupted_exit(result["interrupted"]))
    if result["exit_code"]:
        code = result["exit_code"]
        steps = result["script"]["steps_found"] if result.get("script") else 0 if custom else None
        for text in workload_failed(command, code, steps):
            click.echo(text, err=True)
        sys.exit(workload_exit(code))
