"""`iotune devices`: NVMe drives (or any disks) and why each is in use."""

from __future__ import annotations

import os

import click
from rich.table import Table
from rich.text import Text

from iotune.cli.options import STATE, json_option
from iotune.errors import NotRootError
from iotune.probes.blockdev import BlockDevice, Transport, find_block_devices
from iotune.probes.host import LiveHost
from iotune.probes.nvme_health import Health, controller_of, read_health
from iotune.probes.sysfs import SysTree
from iotune.render import console, emit_json, human_bytes, warn


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
            d.transport_text,
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


def _device_json(d: BlockDevice) -> dict[str, object]:
    """A drive's record; a fabrics namespace's with its state, target and link as well."""
    from iotune.records import to_jsonable

    doc: dict[str, object] = to_jsonable(d)
    doc["fabric"] = d.fabric.to_json() if d.fabric is not None else None
    return doc


def fabrics_table(devs: list[BlockDevice]) -> Table | None:
    """The namespaces reached over NVMe-oF: transport, target, subsystem, state, paths and
    the network link (None where there are none)."""
    rows = [d for d in devs if d.fabric is not None]
    if not rows:
        return None
    t = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title="NVMe over Fabrics (link: the interface the route to the target leaves by)",
        title_justify="left",
    )
    for col in ("DEVICE", "TRANSPORT", "TARGET", "SUBSYSTEM NQN", "STATE", "PATHS", "LINK"):
        t.add_column(col, overflow="fold")
    for d in rows:
        f = d.fabric
        if f is None:
            continue
        live = sum(p.live for p in f.paths)
        t.add_row(
            d.name,
            f.transport,
            f.target,
            f.nqn or "-",
            Text(f.state, style="green" if f.state == "live" else "bold red"),
            f"{live}/{len(f.paths)} live ({', '.join(p.controller for p in f.paths)})",
            f.link_text(),
        )
    return t


def drive_health(devs: list[BlockDevice]) -> dict[str, Health]:
    """The NVMe drives' health logs, by drive (those whose controller answers)."""
    tree = SysTree("/")
    out = {}
    for d in devs:
        ctrl = controller_of(tree, d.name) if d.transport is Transport.NVME else None
        h = read_health(ctrl) if ctrl else None
        if h is not None:
            out[d.name] = h
    return out


def health_table(health: dict[str, Health]) -> Table:
    """What each drive has written and how much of its rated life it says that used
    (TB = 10^12 bytes: the drive counts units of 512,000 bytes)."""
    t = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title="health (NVMe SMART log; TB = 10^12 bytes)",
        title_justify="left",
    )
    for col in ("DEVICE", "WRITTEN TB", "READ TB", "LIFE USED", "SPARE", "POWER-ON h", "MEDIA ERR"):
        t.add_column(col, justify="left" if col == "DEVICE" else "right")
    for name, h in health.items():
        warn_style = "bold red" if h.critical_warning or h.media_errors else ""
        t.add_row(
            name,
            f"{h.written_bytes / 1e12:.3f}",
            f"{h.read_bytes / 1e12:.3f}",
            f"{h.percentage_used}%",
            Text(f"{h.available_spare}%", style=warn_style),
            f"{h.power_on_hours:,}",
            Text(str(h.media_errors), style=warn_style),
        )
    return t


@click.command("devices")
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
    NVMe drives add their health log: data written and read, the share of their rated
    life used, spare capacity, power-on hours, media errors. Namespaces reached over NVMe
    over Fabrics (TCP, RDMA, FC, loop) show their transport, target address, subsystem NQN,
    controller state, live paths and the network link; one with no live path is shown as
    such (and refused by raid create), as is a drive this host's own target exports.
    """
    host = LiveHost()
    names = [host.disk_name(w) for w in device]
    if os.geteuid() != 0:
        raise NotRootError("iotune devices")
    devs = find_block_devices(host)
    if names:
        devs = [d for d in devs if d.name in names]
    elif not show_all:
        others = [d.name for d in devs if d.transport is not Transport.NVME]
        devs = [d for d in devs if d.transport is Transport.NVME]
        if not devs and not STATE.json:
            listed = ", ".join(others) if others else "none"
            warn(f"no NVMe drives found (other disks: {listed}); use --all to list every disk")
    health = drive_health(devs)
    if STATE.json:
        emit_json(
            {
                "devices": [_device_json(d) for d in devs],
                "health": {n: h.to_json() for n, h in health.items()},
            }
        )
        return
    if devs:
        con = console()
        con.print(devices_table(devs))
        fabrics = fabrics_table(devs)
        if fabrics is not None:
            con.print(fabrics)
        if health:
            con.print(health_table(health))
        busy = [d for d in devs if d.in_use]
        if busy:
            con.print()
        for d in busy:
            con.print(f"[bold]{d.name}[/] is in use:")
            for r in d.in_use:
                con.print(f"  - {r.detail}")
