"""NVMe over Fabrics: what stands between a namespace and its drive when the drive is not in
this host's PCIe slots. Read from sysfs, as the kernel's NVMe host driver publishes it:

- each controller, ``/sys/class/nvme/nvmeN``: ``transport`` (pcie, tcp, rdma, fc, loop),
  ``address`` (``traddr=...,trsvcid=...[,host_traddr=...][,host_iface=...][,src_addr=...]``:
  the kernel's fabrics options as nvme-cli gave them, nvmf_get_address), ``subsysnqn`` and
  ``state`` (live, connecting, resetting, deleting, dead, new);
- a namespace's controllers: with native multipath the block device is the subsystem's
  head, and its paths are the hidden ``nvmeXcYnZ`` (listed in ``/sys/block/HEAD/multipath/``
  from kernel 6.14); without it, ``device`` is the one controller;
- the network link: the interface the route to the target address leaves by (the host's
  routing, :meth:`iotune.probes.host.Host.route_iface`) and its ``/sys/class/net/IF/speed``;
- this host's Fibre Channel ports, ``/sys/class/fc_host/hostN``: ``node_name`` and
  ``port_name`` (the WWNN and WWPN nvme-fc takes as ``host_traddr``) and ``port_state``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iotune.errors import IotuneError, ProbeError
from iotune.probes.mounts import existing_ancestor
from iotune.probes.sysfs import SysTree, disk_of

#: transports over a network or another host's driver; "pcie" is a local drive
FABRICS = frozenset({"tcp", "rdma", "fc", "loop"})
#: the kernel module each transport needs on the host side
MODULES = {"tcp": "nvme-tcp", "rdma": "nvme-rdma", "fc": "nvme-fc", "loop": "nvme-loop"}


@dataclass(frozen=True)
class FabricPath:
    controller: str
    transport: str
    traddr: str | None
    trsvcid: str | None
    state: str
    src_addr: str | None = None
    host_iface: str | None = None
    host_traddr: str | None = None  # the host's side as connected (FC: its port's WWNN:WWPN)

    @property
    def target(self) -> str:
        if self.traddr is None:
            return "-"
        host = f"[{self.traddr}]" if ":" in self.traddr and self.trsvcid else self.traddr
        return f"{host}:{self.trsvcid}" if self.trsvcid else host

    @property
    def live(self) -> bool:
        return self.state == "live"


@dataclass(frozen=True)
class Fabric:
    """A namespace reached over a fabric: its paths, the subsystem, the network link."""

    transport: str
    nqn: str | None
    paths: tuple[FabricPath, ...]
    iface: str | None = None
    link_mbps: int | None = None  # the interface's speed, Mb/s; None where it has none

    @property
    def state(self) -> str:
        """live where a path is live; else the first path's state (connecting, ...)."""
        live = [p for p in self.paths if p.live]
        return "live" if live else (self.paths[0].state if self.paths else "gone")

    @property
    def target(self) -> str:
        return ", ".join(dict.fromkeys(p.target for p in self.paths)) or "-"

    def link_text(self) -> str:
        if self.iface is None:
            return "-"
        return f"{self.iface} {self.link_mbps / 1000:g} Gb/s" if self.link_mbps else self.iface

    def link_bytes_s(self) -> float | None:
        """The link's rate in bytes/s (Mb/s as the kernel reports it: 10^6 bits)."""
        return self.link_mbps * 1e6 / 8 if self.link_mbps else None

    def describe(self) -> str:
        link = f" ({self.link_text()})" if self.iface else ""
        return f"nvme-{self.transport} {self.target}{link}"

    def to_json(self) -> dict[str, Any]:
        return {
            "transport": self.transport,
            "nqn": self.nqn,
            "state": self.state,
            "target": self.target,
            "paths": [
                {
                    "controller": p.controller,
                    "traddr": p.traddr,
                    "trsvcid": p.trsvcid,
                    "state": p.state,
                    "src_addr": p.src_addr,
                    "host_iface": p.host_iface,
                    "host_traddr": p.host_traddr,
                }
                for p in self.paths
            ],
            "iface": self.iface,
            "link_mbps": self.link_mbps,
        }


def parse_address(text: str | None) -> dict[str, str]:
    """``traddr=10.0.0.2,trsvcid=4420,src_addr=10.0.0.1`` → its keys and values."""
    out: dict[str, str] = {}
    for part in (text or "").replace("\n", ",").split(","):
        key, sep, value = part.strip().partition("=")
        if sep and key:
            out[key] = value.strip()
    return out


def mpath_paths(tree: SysTree, disk: str) -> list[str]:
    """The paths (``nvme1c2n1``: subsystem 1, controller 2, namespace 1) of a multipath head
    (``nvme1n1``): from its ``multipath/`` links (kernel 6.14 and newer), else by name among
    the block devices, as every kernel names them. [] for anything else."""
    listed = tree.listdir(f"/sys/block/{disk}/multipath")
    if listed:
        return listed
    m = re.fullmatch(r"nvme(\d+)n(\d+)", disk)
    if not m:
        return []
    pattern = re.compile(rf"nvme{m.group(1)}c\d+n{m.group(2)}")
    return [n for n in tree.listdir("/sys/block") if pattern.fullmatch(n)]


def controllers_of(tree: SysTree, disk: str) -> list[str]:
    """The controllers (``nvme3``) behind a namespace's block device, one per path."""
    paths = mpath_paths(tree, disk)
    found: list[str] = []
    for p in paths or [disk]:
        dev = f"/sys/block/{p}/device"
        if not tree.exists(dev):
            continue
        name = Path(tree.realpath(dev)).name
        if re.fullmatch(r"nvme\d+", name):
            found.append(name)
        else:  # a head without multipath/: its subsystem lists the controllers
            found += [c for c in tree.listdir(dev) if re.fullmatch(r"nvme\d+", c)]
    return sorted(dict.fromkeys(found), key=lambda c: int(c[4:]))


def read_path(tree: SysTree, controller: str) -> FabricPath:
    base = f"/sys/class/nvme/{controller}"
    addr = parse_address(tree.read(f"{base}/address"))
    return FabricPath(
        controller=controller,
        transport=(tree.read(f"{base}/transport") or "?").strip(),
        traddr=addr.get("traddr"),
        trsvcid=addr.get("trsvcid"),
        state=(tree.read(f"{base}/state") or "gone").strip(),
        src_addr=addr.get("src_addr"),
        host_iface=addr.get("host_iface"),
        host_traddr=addr.get("host_traddr"),
    )


def fc_host_ports(tree: SysTree) -> list[str]:
    """This host's online Fibre Channel ports as nvme-fc takes them for ``host_traddr``:
    ``nn-0x<WWNN>:pn-0x<WWPN>`` from ``/sys/class/fc_host/hostN`` (node_name and port_name
    read ``0x`` and 16 hex digits)."""
    out = []
    for host in sorted(tree.listdir("/sys/class/fc_host")):
        base = f"/sys/class/fc_host/{host}"
        if (tree.read(f"{base}/port_state") or "").strip() != "Online":
            continue
        nn = (tree.read(f"{base}/node_name") or "").strip().lower()
        pn = (tree.read(f"{base}/port_name") or "").strip().lower()
        if re.fullmatch(r"0x[0-9a-f]{16}", nn) and re.fullmatch(r"0x[0-9a-f]{16}", pn):
            out.append(f"nn-{nn}:pn-{pn}")
    return out


def link_speed(tree: SysTree, iface: str) -> int | None:
    """The interface's speed in Mb/s; None for a link that reports none (lo, virtual NICs
    report -1 or fail the read)."""
    try:
        v = tree.read_int(f"/sys/class/net/{iface}/speed")
    except ProbeError:  # a speed that is not a number: none to plan with
        return None
    return v if v is not None and v > 0 else None


def read_fabric(
    tree: SysTree, disk: str, route_iface: Callable[[str], str | None] | None = None
) -> Fabric | None:
    """The fabric behind *disk*; None for a local (PCIe) namespace or not NVMe at all.
    *route_iface*(traddr) names the interface the route to an address leaves by."""
    if not disk.startswith("nvme"):
        return None
    paths = tuple(read_path(tree, c) for c in controllers_of(tree, disk))
    fabric = tuple(p for p in paths if p.transport in FABRICS)
    if not fabric:
        return None
    first = fabric[0]
    nqn = tree.read(f"/sys/class/nvme/{first.controller}/subsysnqn")
    iface = first.host_iface
    if iface is None and first.traddr and first.transport in ("tcp", "rdma") and route_iface:
        iface = route_iface(first.traddr)
    return Fabric(
        transport=first.transport,
        nqn=nqn,
        paths=fabric,
        iface=iface,
        link_mbps=link_speed(tree, iface) if iface else None,
    )


#: the hint of every refusal and stop over a namespace without a live path
DOWN_HINT = (
    "the target, or the network to it, is down: 'iotune devices --all' shows the namespace's paths"
)


def lost_under(tree: SysTree, name: str, _seen: frozenset[str] = frozenset()) -> str | None:
    """The NVMe-oF namespace without a live path that a read of block device *name* would
    wait on (itself, or one under it through md/dm slaves and partitions); None if none."""
    disk = disk_of(tree, name) or name
    f = read_fabric(tree, disk)
    if f is not None and f.state != "live":
        return disk
    for s in tree.listdir(f"/sys/block/{disk}/slaves"):
        if s not in _seen and (lost := lost_under(tree, s, _seen | {disk})) is not None:
            return lost
    return None


def lost_behind(tree: SysTree, dev: int) -> str | None:
    """Device number *dev* (a file system's, or a block device's own): the namespace
    without a live path its reads and writes would wait on, in words; None if none."""
    node = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    if os.major(dev) == 0 or not tree.exists(node):
        return None  # tmpfs, overlay, NFS: no block device
    lost = lost_under(tree, Path(tree.realpath(node)).name)
    f = read_fabric(tree, lost) if lost else None
    if lost is None or f is None:
        return None
    return f"{lost}, which has no live path to {f.describe()} ({f.state})"


def refuse_lost(path: Path, what: str, tree: SysTree | None = None) -> None:
    """Refuse, in one line, to use *path* (a folder or a block device) when its reads and
    writes would wait on an NVMe-oF namespace without a live path: they queue until the
    controller's ``ctrl_loss_tmo`` (600 s by default), and a check that writes there first
    would stand still as long. Call it before anything touches the path's data."""
    st = os.stat(existing_ancestor(path))
    lost = lost_behind(tree or SysTree("/"), st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev)
    if lost is not None:
        raise IotuneError(
            f"{what} {path} is on {lost}: its reads and writes would wait for the "
            "controller's ctrl_loss_tmo",
            hint=f"{DOWN_HINT}; run again once it is live",
        )


#: where configfs shows this host's own NVMe-oF target (the nvmet module)
NVMET = "/sys/kernel/config/nvmet"


def target_exports(tree: SysTree) -> dict[str, list[str]]:
    """The disks this host's NVMe-oF target exports, by kernel name: each as
    ``NQN namespace N`` (enabled namespaces whose device_path names a /dev node)."""
    out: dict[str, list[str]] = {}
    for nqn in tree.listdir(f"{NVMET}/subsystems"):
        for ns in tree.listdir(f"{NVMET}/subsystems/{nqn}/namespaces"):
            base = f"{NVMET}/subsystems/{nqn}/namespaces/{ns}"
            path = tree.read(f"{base}/device_path") or ""
            if tree.read(f"{base}/enable") != "1" or not path.startswith("/dev/"):
                continue
            name = Path(tree.realpath(path)).name if tree.is_link(path) else Path(path).name
            out.setdefault(name, []).append(f"{nqn} namespace {ns}")
    return out
