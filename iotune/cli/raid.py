"""`iotune raid create|status|destroy`: plan-then-apply md RAID volumes."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from rich.table import Table

from iotune.cli.devices import _resolve_names
from iotune.cli.options import (
    STATE,
    json_option,
)
from iotune.errors import DeviceNotFound, IotuneError, NotRootError, UsageError
from iotune.probes.blockdev import BlockDevice, find_block_devices
from iotune.probes.host import LiveHost
from iotune.probes.sysfs import SysTree
from iotune.render import console, emit_json, human_bytes
from iotune.units import format_size


@click.group("raid")
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
