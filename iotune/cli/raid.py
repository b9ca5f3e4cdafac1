"""`iotune raid create|status|destroy`: plan-then-apply md RAID volumes.

The rules (layout files, merging them with flags, when an existing array matches, the plan,
the md driver) live in :mod:`iotune.raid`. With --json, stdout carries exactly one document:
the plan for --dry-run, else the outcome; a plan awaiting confirmation is shown on stderr.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import click
from rich.console import Console

from iotune.cli.options import STATE, confirm, json_option
from iotune.errors import NotRootError
from iotune.probes.host import LiveHost
from iotune.probes.sysfs import SysTree
from iotune.raid.model import ArrayInfo, Step
from iotune.raid.request import CreateFlags, load_layout, request_from
from iotune.render import console, emit_json, err_console, human_bytes


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


def _show_plan(
    document: dict[str, Any], show: Callable[[Console], None], dry_run: bool, yes: bool
) -> None:
    """The plan: a table on stdout, or with --json the document of a --dry-run; with --json
    and a confirmation to come, text on stderr, so the one document is the outcome."""
    if not STATE.json:
        show(console())
    elif dry_run:
        emit_json(document)
    elif not yes:
        show(err_console())


def _show_existing(info: ArrayInfo) -> None:
    from iotune.raid.plan import existing_members

    if STATE.json:
        emit_json({"plan": None, "exists": info, "changed": False})
    else:
        console().print(
            f"{info.device} already exists as asked ({info.level}, "
            f"{', '.join(existing_members(info))}): nothing to do"
        )


def _progress(steps: Sequence[Step]) -> Callable[[int, Step], None]:
    def show(i: int, step: Step) -> None:
        if not STATE.json:
            click.echo(f"[{i + 1}/{len(steps)}] {step.describe()}", err=True)

    return show


def _flags(ctx: click.Context) -> CreateFlags:
    """The create command's flags by layout key, noting those given on the command line."""
    p = ctx.params
    given = {
        "mount" if k == "mountpoint" else k
        for k in p
        if ctx.get_parameter_source(k) == click.core.ParameterSource.COMMANDLINE
    }
    return CreateFlags(
        devices=p["devices"],
        all_unused=p["all_unused"],
        level=int(p["level"]),
        chunk=p["chunk"],
        name=p["name"],
        fs=p["fs"],
        mount=p["mountpoint"],
        persist=p["persist"],
        wipe=p["wipe"],
        mkfs_options=p["mkfs_opts"],
        given=frozenset(given),
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
    from iotune.raid import host as raid_host
    from iotune.raid.render import print_plan

    req = request_from(load_layout(layout) if layout else {}, _flags(click.get_current_context()))
    if os.geteuid() != 0:
        raise NotRootError("iotune raid create")
    host = LiveHost()
    outcome = raid_host.prepare_create(host, req)
    if isinstance(outcome, ArrayInfo):
        _show_existing(outcome)
        return
    plan, disks = outcome.plan, outcome.disks
    _show_plan(
        {"plan": plan, "applied": False}, lambda con: print_plan(con, plan, disks), dry_run, yes
    )
    if dry_run:
        return
    confirm(yes, f"Build {plan.device}")
    raid_apply.ensure_md(req.level, SysTree("/"))
    raid_apply.apply_create(plan, host.tree, on_step=_progress(plan.steps))
    info = raid_host.array_info(LiveHost(), raid_apply.kernel_name(plan.device))
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
    from iotune.raid import host as raid_host
    from iotune.raid.render import arrays_table

    host = LiveHost()
    if name:
        arrays = [raid_host.array_info(host, raid_host.named_array(host, name))]
    else:
        arrays = raid_host.list_arrays(host)
    if STATE.json:
        emit_json({"arrays": arrays})
    elif not arrays:
        console().print("no md arrays")
    else:
        console().print(arrays_table(arrays))


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
    from iotune.raid import host as raid_host
    from iotune.raid.render import print_destroy_plan

    if os.geteuid() != 0:
        raise NotRootError("iotune raid destroy")
    facts, steps = raid_host.prepare_destroy(LiveHost(), name, wipe_members=wipe_members)
    _show_plan(
        {"plan": steps, "applied": False},
        lambda con: print_destroy_plan(con, facts, steps),
        dry_run,
        yes,
    )
    if dry_run:
        return
    confirm(yes, f"Destroy {facts.device}")
    raid_apply.apply_steps(steps, on_step=_progress(steps))
    if STATE.json:
        emit_json({"plan": steps, "applied": True})
    else:
        console().print(f"destroyed {facts.device}; members {', '.join(facts.members)} are free")
