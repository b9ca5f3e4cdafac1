"""The `iotune` command line. Thin: parse options, call the library, render the result."""

from __future__ import annotations

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
from iotune.render import console, emit_json, human_bytes, warn
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
        except Exception as exc:
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
      iotune trace     count every block request per drive by exact size (eBPF),
                       checked against the kernel's counters

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


# --------------------------------------------------------------------------- trace


def _pick_backend(backend: str) -> str:
    if backend != "auto":
        if backend == "bcc" and os.geteuid() != 0:
            raise NotRootError("iotune trace --backend bcc")
        return backend
    tree = SysTree("/")
    problems = []
    if os.geteuid() != 0:
        problems.append("not root")
    if doctor.tracefs_dir(tree) is None:
        problems.append("tracefs not mounted")
    if doctor.check_bcc().status is doctor.Status.FAIL:
        problems.append("bcc not importable")
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
    command: tuple[str, ...],
) -> None:
    """Count every block request per drive, by exact size, while COMMAND runs (or for --duration).

    \b
    iotune trace --devices nvme0n1 --duration 30
    iotune trace --target /mnt/offload -- python train.py
    iotune trace --devices loop0 --focus-size 512K -- fio job.fio

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
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        import tomli as tomllib

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


# --------------------------------------------------------------------------- entry point


def main() -> None:
    """Console entry point (``iotune``)."""
    cli()
