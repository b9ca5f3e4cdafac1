"""Which socket the GPUs and the drives hang off, from sysfs: the NUMA nodes and their CPUs,
each GPU's PCI device and its node, and a plan's note on the ranks whose swaps cross from one
socket to the other. Read through a SysTree (a recorded host in the tests).

A GPU is a PCI display or 3D controller (class 0x0300, 0x0302) of NVIDIA or AMD; a server
board's own VGA (ASPEED, Matrox) is not one. Rank r runs on the r-th of them in PCI order,
the order ``nvidia-smi`` lists them and DeepSpeed's launcher numbers them where
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (on a node of one GPU model CUDA's own order is the same).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from iotune.probes.blockdev import disk_numa
from iotune.probes.sysfs import SysTree

#: GPU makers' PCI vendor IDs
GPU_VENDORS = {"0x10de": "NVIDIA", "0x1002": "AMD"}
#: PCI classes of a GPU: VGA-compatible controller, 3D controller
GPU_CLASSES = ("0x0300", "0x0302")
PCI = "/sys/bus/pci/devices"
NODES = "/sys/devices/system/node"


@dataclass(frozen=True)
class Gpu:
    address: str  # PCI domain:bus:device.function
    vendor: str
    numa: int | None


def cpulist_count(text: str) -> int:
    """CPUs in a kernel cpulist: ``0-27,56-83`` is 56."""
    n = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def numa_nodes(tree: SysTree) -> dict[int, int]:
    """Each NUMA node with CPUs, and how many (a memory-only node is left out)."""
    out = {}
    for entry in tree.listdir(NODES):
        if entry.startswith("node") and entry[4:].isdigit():
            cpus = cpulist_count(tree.read(f"{NODES}/{entry}/cpulist") or "")
            if cpus:
                out[int(entry[4:])] = cpus
    return dict(sorted(out.items()))


def gpus(tree: SysTree) -> list[Gpu]:
    """The GPUs on the PCI bus, in PCI order, each with its NUMA node."""
    out = []
    for addr in sorted(tree.listdir(PCI)):
        vendor = (tree.read(f"{PCI}/{addr}/vendor") or "").lower()
        cls = (tree.read(f"{PCI}/{addr}/class") or "").lower()
        if vendor in GPU_VENDORS and cls[:6] in GPU_CLASSES:
            node = tree.read_int(f"{PCI}/{addr}/numa_node")
            out.append(
                Gpu(addr, GPU_VENDORS[vendor], node if node is not None and node >= 0 else None)
            )
    return out


def _span(ranks: Sequence[int]) -> str:
    """0,1,2,3,6 -> '0-3, 6'."""
    parts: list[str] = []
    for r in sorted(ranks):
        if parts and parts[-1].split("-")[-1] == str(r - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{r}"
        else:
            parts.append(str(r))
    return ", ".join(parts)


def crossing_note(tree: SysTree, disks: Sequence[str], ranks: int, what: str) -> str | None:
    """What a plan says of the sockets, where the host is in hand: the NUMA nodes, the GPUs'
    and *disks*' (the volume *what* is on) nodes, and which of *ranks* ranks (rank r on GPU
    r) swap to drives of another socket. None where there is nothing to say: one rank on a
    host of one node."""
    nodes = numa_nodes(tree)
    if len(nodes) <= 1:
        if ranks <= 1:
            return None
        return "NUMA: one node on this host: no rank's swaps cross sockets"
    head = "NUMA: " + ", ".join(f"node {n} {c} CPUs" for n, c in nodes.items())
    on = {d: disk_numa(tree, d) for d in disks}
    known = {n for n in on.values() if n is not None}
    drives = ", ".join(f"{d} node {'?' if n is None else n}" for d, n in on.items())
    found = gpus(tree)[: max(1, ranks)]
    if not found or not disks or not known or any(g.numa is None for g in found):
        return f"{head}; the sockets of the GPUs or of {what}'s drives are not known ({drives})"
    by_node: dict[int, list[int]] = {}
    for r, g in enumerate(found):
        by_node.setdefault(g.numa, []).append(r)  # type: ignore[arg-type]
    gpu_text = "; ".join(f"rank(s) {_span(rs)} on GPUs of node {n}" for n, rs in by_node.items())
    short = f" (the host has {len(found)} GPU(s) for {ranks} ranks)" if len(found) < ranks else ""
    if len(known) > 1:
        cross = (
            f"{what} stripes over drives of {len(known)} sockets ({drives}): every rank's swaps "
            "cross sockets for the share on the other socket's drives"
        )
        away = True
    else:
        (home,) = known
        off = [r for r, g in enumerate(found) if g.numa != home]
        cross = f"{what}'s drives on node {home} ({drives}): " + (
            f"rank(s) {_span(off)} swap across sockets" if off else "no rank's swaps cross sockets"
        )
        away = bool(off)
    cost = " (what crossing costs is not measured here)" if away else ""
    return f"{head}; {gpu_text}{short}; {cross}{cost}"
