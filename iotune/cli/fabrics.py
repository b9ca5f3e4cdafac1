"""`iotune fabrics connect|disconnect`: NVMe over Fabrics namespaces in, checked first (the
transport's module, the target answering, the subsystem offered), and out, never while one
of them is in use. The rules are in :mod:`iotune.fabrics`."""

from __future__ import annotations

import os
import shlex
from typing import Any

import click

from iotune.cli.options import STATE, confirm, json_option
from iotune.errors import IotuneError, NotRootError, UsageError
from iotune.probes.sysfs import SysTree
from iotune.render import console, emit_json

#: what keeps a namespace from being disconnected: something holds it open or on it
_HOLDS = frozenset({"mounted", "holders", "swap", "root", "boot", "busy"})


@click.group("fabrics")
def fabrics_group() -> None:
    """Connect NVMe over Fabrics namespaces (TCP, RDMA, FC, loop) with nvme-cli, checked
    first; disconnect them when nothing uses them.

    \b
    iotune fabrics connect tcp://10.0.0.2:4420 --nqn nqn.2026-01.com.example:flash
    iotune fabrics connect rdma://10.0.0.2          the one subsystem the target offers
    iotune fabrics connect fc://nn-0x20000090fa942779:pn-0x10000090fa942779
        --host-traddr nn-0x20000090fa94277a:pn-0x10000090fa94277a   this host's FC port
    iotune fabrics disconnect nqn.2026-01.com.example:flash

    Once connected, the namespaces are drives like the others: `iotune devices` shows
    their transport, target, controller state and link, and `raid create`, `sweep-aio`
    and `trace` take them.
    """


def _root(what: str) -> None:
    if os.geteuid() != 0:
        raise NotRootError(what)


@fabrics_group.command("connect")
@click.argument("target")
@click.option("--nqn", help="The subsystem to connect (default: the one the target offers).")
@click.option("--host-iface", help="TCP: the network interface to connect from.")
@click.option(
    "--host-traddr",
    metavar="ADDRESS",
    help="The host's side (nvme-cli's --host-traddr): FC: this host's port as "
    "nn-0x<WWNN>:pn-0x<WWPN>, required; TCP, RDMA: the address to connect from.",
)
@click.option("--dry-run", is_flag=True, help="Check and show the command; connect nothing.")
@json_option
def fabrics_connect(
    target: str, nqn: str | None, host_iface: str | None, host_traddr: str | None, dry_run: bool
) -> None:
    """Connect the subsystem at TARGET (TRANSPORT://ADDRESS[:PORT], port 4420 by default;
    fc://nn-0x<WWNN>:pn-0x<WWPN> with --host-traddr; or 'loop').

    Before nvme-cli is asked: the transport's kernel module is loaded (named, with the kernel
    option, where the kernel has none), a TCP target's port answers, and the target's
    discovery log offers the subsystem (those it offers are listed where it does not). A
    subsystem already connected at that address (however it is written: 10.000.0.1 is
    10.0.0.1, 0:0::1 is ::1) is left as it is.
    """
    from iotune.fabrics import connect as fc
    from iotune.fabrics.target import choose_nqn, parse_target
    from iotune.probes.fabrics import fc_host_ports

    where = parse_target(target, host_traddr, fc_host_ports(SysTree("/")))
    if host_iface and where.transport != "tcp":
        raise UsageError("--host-iface is for the tcp transport", hint="leave it out")
    _root("iotune fabrics connect")
    fc.need_nvme_cli()
    tree = SysTree("/")
    fc.load_module(where, tree)
    fc.check_answers(where)
    if where.transport == "loop":  # no discovery controller to ask
        if nqn is None:
            raise UsageError("the loop transport needs --nqn", hint="--nqn the subsystem's NQN")
        chosen = nqn
    else:
        chosen = choose_nqn(where, fc.discover(where), nqn)
    there = [c for c in fc.controllers(tree) if fc.same_place(c, where, chosen)]
    doc: dict[str, Any] = {"target": where.text(), "nqn": chosen, "dry_run": dry_run}
    if where.host_traddr is not None:
        doc["host_traddr"] = where.host_traddr
    if there:
        already = [c.name for c in there]
        names = fc.namespaces_of(tree, chosen)
        doc |= {"connected": False, "already": already, "namespaces": names}
        _say(
            doc,
            f"{chosen} at {where.text()} is already connected ({', '.join(already)}): "
            + (", ".join(f"/dev/{n}" for n in names) or "no namespace"),
        )
        return
    if dry_run:
        argv = ["nvme", "connect", *where.nvme_args(), "-n", chosen]
        doc |= {"connected": False, "command": argv}
        _say(doc, f"would run: {shlex.join(argv)}")
        return
    done = fc.connect(where, chosen, tree, host_iface)
    doc |= {"connected": True, **done}
    listed = ", ".join(f"/dev/{n}" for n in done["namespaces"]) or "no namespace yet"
    _say(doc, f"connected {chosen} at {where.text()} as {done['controller']}: {listed}")


@fabrics_group.command("disconnect")
@click.argument("nqn")
@click.option("--dry-run", is_flag=True, help="Show what would be disconnected; change nothing.")
@click.option("--yes", is_flag=True, help="Disconnect without asking.")
@json_option
def fabrics_disconnect(nqn: str, dry_run: bool, yes: bool) -> None:
    """Disconnect every controller of the subsystem NQN (`nvme disconnect`).

    Refused while one of its namespaces is mounted, held by an md or dm device, used as
    swap or open exclusively: the data stays on the target, but what uses it would fail.
    """
    from iotune.fabrics import connect as fc
    from iotune.probes.blockdev import find_block_devices
    from iotune.probes.host import LiveHost

    _root("iotune fabrics disconnect")
    fc.need_nvme_cli()
    tree = SysTree("/")
    ctrls = [c for c in fc.controllers(tree) if c.nqn == nqn]
    if not ctrls:
        raise UsageError(
            f"no controller is connected to {nqn}",
            hint="'iotune devices --all' shows each fabrics namespace with its subsystem",
        )
    names = fc.namespaces_of(tree, nqn)
    devs = {d.name: d for d in find_block_devices(LiveHost()) if d.name in names}
    for n in names:
        held = [r.detail for r in devs[n].in_use if r.kind.value in _HOLDS] if n in devs else []
        if held:
            raise IotuneError(
                f"refusing to disconnect {nqn}: /dev/{n} is in use ({'; '.join(held)})",
                hint="stop what uses it first (iotune raid destroy NAME, umount, swapoff)",
            )
    doc: dict[str, Any] = {
        "nqn": nqn,
        "controllers": [c.name for c in ctrls],
        "namespaces": names,
        "dry_run": dry_run,
    }
    plan = (
        f"nvme disconnect -n {nqn}: controllers {', '.join(c.name for c in ctrls)}, "
        f"namespaces {', '.join(f'/dev/{n}' for n in names) or 'none'}"
    )
    if dry_run:
        _say(doc | {"disconnected": 0}, f"would run {plan}")
        return
    if not STATE.json:
        console().print(plan)
    confirm(yes, f"Disconnect {nqn}")
    doc["disconnected"] = fc.disconnect(nqn)
    _say(doc, f"disconnected {nqn}: {doc['disconnected']} controller(s)")


def _say(doc: dict[str, Any], text: str) -> None:
    if STATE.json:
        emit_json(doc)
    else:
        console().print(text)
