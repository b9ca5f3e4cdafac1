"""Connect and disconnect NVMe over Fabrics namespaces with nvme-cli, checked first: the
transport's kernel module, the target answering, the subsystem offered (``nvme discover``),
and, to disconnect, none of its namespaces in use."""

from __future__ import annotations

import errno
import json
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from iotune import proc
from iotune.errors import CommandFailed, IotuneError, ToolMissing, last_line
from iotune.fabrics.target import (
    CONFIG,
    Offer,
    Target,
    address_key,
    ip_of,
    parse_discovery,
    port_key,
)
from iotune.probes.fabrics import FabricPath, controllers_of, read_path
from iotune.probes.sysfs import SysTree

#: seconds to wait for a TCP target's port to answer
ANSWER_S = 5.0
#: seconds to wait for a new controller's namespaces to appear as block devices
APPEAR_S = 30.0


def need_nvme_cli() -> None:
    import shutil

    if shutil.which("nvme") is None:
        raise ToolMissing("nvme", "nvme-cli")


def load_module(target: Target, tree: SysTree) -> None:
    """The transport's host module loaded (or built in), else the module named."""
    mod = target.module
    loaded = f"/sys/module/{mod.replace('-', '_')}"
    if tree.exists(loaded):
        return
    done = proc.run(["modprobe", mod], check=False, timeout=60)
    if done.returncode != 0 or not tree.exists(loaded):
        why = last_line(done.stderr) or f"modprobe exited {done.returncode}"
        raise IotuneError(
            f"the kernel has no {mod} module, which the {target.transport} transport needs ({why})",
            hint=f"install this kernel's extra modules (e.g. linux-modules-extra-$(uname -r)), "
            f"or use a kernel built with {CONFIG[target.transport]}",
        )


def check_answers(target: Target, timeout_s: float = ANSWER_S) -> None:
    """A TCP target's port takes a connection; anything else is named in one line."""
    if target.transport != "tcp" or target.traddr is None or target.trsvcid is None:
        return
    where = target.text()
    hint = (
        "check the address and port, that the target exports on them (nvmet: its port's "
        "addr_traddr and addr_trsvcid), and any firewall between"
    )
    try:
        with socket.create_connection((target.traddr, int(target.trsvcid)), timeout=timeout_s):
            return
    except TimeoutError:
        raise IotuneError(f"no answer from {where} in {timeout_s:g} s", hint=hint) from None
    except socket.gaierror as exc:
        raise IotuneError(
            f"{where}: {target.traddr} does not resolve ({exc.strerror})", hint=hint
        ) from None
    except OSError as exc:
        why = (
            "connection refused: nothing listens there"
            if exc.errno == errno.ECONNREFUSED
            else exc.strerror or str(exc)
        )
        raise IotuneError(f"{where} does not answer ({why})", hint=hint) from None


def discover(target: Target) -> list[Offer]:
    """What the target's discovery controller offers."""
    argv = ["nvme", "discover", *target.nvme_args(), "-o", "json"]
    done = proc.run(argv, check=False, timeout=60)
    if done.returncode != 0:
        why = last_line(done.stderr) or last_line(done.stdout) or f"exit {done.returncode}"
        head = (
            f"{target.text()} answers but its discovery failed"
            if target.transport == "tcp"
            else f"the discovery at {target.text()} failed"
        )
        raise IotuneError(
            f"{head}: {why}",
            hint="the port may not be an NVMe over Fabrics target; run with --debug for "
            "nvme-cli's output",
        )
    try:
        doc = json.loads(done.stdout or "{}")
    except json.JSONDecodeError:
        raise CommandFailed(argv, 0, "its output is not JSON") from None
    return parse_discovery(doc)


@dataclass(frozen=True)
class Controller:
    name: str  # nvme3
    nqn: str
    path: FabricPath  # its transport, address and state, as the devices probe reads them


def controllers(tree: SysTree) -> list[Controller]:
    names = sorted(
        tree.listdir("/sys/class/nvme"), key=lambda c: int(c[4:]) if c[4:].isdigit() else 0
    )
    return [
        Controller(
            c, (tree.read(f"/sys/class/nvme/{c}/subsysnqn") or "").strip(), read_path(tree, c)
        )
        for c in names
    ]


def namespaces_of(tree: SysTree, nqn: str) -> list[str]:
    """The block devices (``nvme3n1``: multipath heads, or a controller's own namespaces)
    of a subsystem, by kernel name."""
    out = []
    for d in tree.listdir("/sys/block"):
        if not re.fullmatch(r"nvme\d+n\d+", d):
            continue
        nqns = {
            (tree.read(f"/sys/class/nvme/{c}/subsysnqn") or "").strip()
            for c in controllers_of(tree, d)
        }
        if nqn in nqns:
            out.append(d)
    return sorted(out)


def resolve_host(name: str) -> list[str]:
    """The addresses a host name resolves to ([] where it does not)."""
    try:
        return [str(a[4][0]) for a in socket.getaddrinfo(name, None)]
    except (socket.gaierror, UnicodeError):
        return []


def same_place(
    c: Controller,
    target: Target,
    nqn: str,
    resolve: Callable[[str], Iterable[str]] = resolve_host,
) -> bool:
    """Whether controller *c* connects subsystem *nqn* at *target* (and from its
    host_traddr, where one is given). The kernel shows each address as nvme-cli gave it
    (nvmf_get_address), so both sides are compared as the kernel reads them: ``10.000.0.1``
    is ``10.0.0.1``, ``0:0::1`` is ``::1``, an FC port's hex digits in either case; a host
    name is the addresses it resolves to (nvme-cli resolves it before the kernel sees it)."""
    p = c.path
    if (c.nqn, p.transport) != (nqn, target.transport):
        return False
    if target.transport in ("tcp", "rdma") and port_key(p.trsvcid) != port_key(target.trsvcid):
        return False
    here = address_key(p.transport, p.traddr)
    wanted = {address_key(target.transport, target.traddr)}
    if target.traddr is not None and ip_of(target.traddr) is None and target.transport != "fc":
        wanted |= {address_key(target.transport, a) for a in resolve(target.traddr)}
    if here not in wanted:
        return False
    if target.host_traddr is not None:
        return address_key(p.transport, p.host_traddr) == address_key(
            target.transport, target.host_traddr
        )
    return True


def connect(
    target: Target,
    nqn: str,
    tree: SysTree,
    host_iface: str | None = None,
) -> dict[str, Any]:
    """``nvme connect``, then the namespaces it brought, once they are block devices."""
    argv = ["nvme", "connect", *target.nvme_args(), "-n", nqn, "-o", "json"]
    if host_iface:
        argv += ["-f", host_iface]
    done = proc.run(argv, check=False, timeout=120)
    if done.returncode != 0:
        why = last_line(done.stderr) or f"exit {done.returncode}"
        raise IotuneError(
            f"nvme connect to {nqn} at {target.text()} failed: {why}",
            hint="run with --debug for nvme-cli's output; the target's dmesg says why it "
            "refused a host",
        )
    try:
        controller = json.loads(done.stdout or "{}").get("device")
    except json.JSONDecodeError:
        controller = None
    # the kernel scans the controller's namespaces after the connect returns, one block
    # device at a time: wait for as many as the controller reports active
    want = active_namespaces(controller)
    deadline = time.monotonic() + APPEAR_S
    while True:
        names = namespaces_of(tree, nqn)
        if (len(names) >= want if want is not None else names) or time.monotonic() > deadline:
            return {"controller": controller, "namespaces": names}
        time.sleep(0.5)


def active_namespaces(controller: str | None) -> int | None:
    """How many namespaces *controller* reports active (``nvme list-ns``); None where it
    cannot say (then the first that appears is taken for all)."""
    if not controller:
        return None
    done = proc.run(
        ["nvme", "list-ns", f"/dev/{controller}", "-o", "json"], check=False, timeout=30
    )
    return nsid_count(done.stdout) if done.returncode == 0 else None


def nsid_count(text: str | None) -> int | None:
    """The namespaces in ``nvme list-ns -o json``'s answer (``nsid_list``, left out when the
    list is empty); None for what is not that answer."""
    try:
        doc = json.loads(text or "")
    except json.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    ids = doc.get("nsid_list", [])
    return len(ids) if isinstance(ids, list) else None


def disconnect(nqn: str) -> int:
    """``nvme disconnect -n NQN``: the controllers it removed."""
    done = proc.run(["nvme", "disconnect", "-n", nqn], timeout=120)
    text = done.stdout or ""
    # "NQN:nqn... disconnected 2 controller(s)"
    for word in text.split():
        if word.isdigit():
            return int(word)
    return 0
