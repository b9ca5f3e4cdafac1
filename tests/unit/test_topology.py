"""Which socket the GPUs and the drives hang off (iotune/probes/topology.py), on sysfs trees
written here as a two-socket node's kernel shows them; each note's ranks counted by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from iotune.probes.sysfs import SysTree
from iotune.probes.topology import Gpu, cpulist_count, crossing_note, gpus, numa_nodes


def _write(root: Path, rel: str, text: str) -> None:
    f = root / rel.lstrip("/")
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text + "\n")


def _node(
    root: Path,
    cpus: dict[int, str],
    pci: list[tuple[str, str, str, int]],
    disks: dict[str, int],
) -> SysTree:
    """A host: NUMA nodes (their cpulists), PCI devices (address, vendor, class, node), and
    NVMe disks (their controller's node, as /sys/block/X/device/device/numa_node has it)."""
    for n, cpulist in cpus.items():
        _write(root, f"/sys/devices/system/node/node{n}/cpulist", cpulist)
    _write(root, "/sys/devices/system/node/online", "0-1")
    for addr, vendor, cls, n in pci:
        for key, value in (("vendor", vendor), ("class", cls), ("numa_node", str(n))):
            _write(root, f"/sys/bus/pci/devices/{addr}/{key}", value)
    for disk, n in disks.items():
        _write(root, f"/sys/block/{disk}/device/device/numa_node", str(n))
    return SysTree(root)


#: a DGX-like node: 8 NVIDIA 3D controllers, 4 a socket, an ASPEED VGA, a NIC
PCI = [
    *((f"0000:{b:02x}:00.0", "0x10de", "0x030200", 0) for b in (0x18, 0x2A, 0x3A, 0x5D)),
    *((f"0000:{b:02x}:00.0", "0x10de", "0x030200", 1) for b in (0x9A, 0xAB, 0xBA, 0xDB)),
    ("0000:03:00.0", "0x1a03", "0x030000", 0),  # the board's own VGA: not a GPU
    ("0000:0c:00.0", "0x15b3", "0x020000", 0),  # a NIC
]
CPUS = {0: "0-55,112-167", 1: "56-111,168-223"}


def test_the_kernels_cpulists_and_the_gpus_in_pci_order(tmp_path: Path) -> None:
    assert [cpulist_count(t) for t in ("0-27,56-83", "3", "0-1,4", "", "0-55,112-167")] == [
        56,
        1,
        3,
        0,
        112,
    ]
    tree = _node(tmp_path, {**CPUS, 2: ""}, PCI, {})  # node 2: memory only
    assert numa_nodes(tree) == {0: 112, 1: 112}
    found = gpus(tree)
    assert [g.numa for g in found] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert found[0] == Gpu("0000:18:00.0", "NVIDIA", 0)
    assert all(g.vendor == "NVIDIA" for g in found)


@pytest.mark.parametrize(
    ("disks", "ranks", "note"),
    [
        # the volume on socket 0: ranks 4-7's GPUs are on socket 1
        (
            {"nvme0n1": 0, "nvme1n1": 0},
            8,
            "NUMA: node 0 112 CPUs, node 1 112 CPUs; rank(s) 0-3 on GPUs of node 0; rank(s) "
            "4-7 on GPUs of node 1; the swept volume's drives on node 0 (nvme0n1 node 0, "
            "nvme1n1 node 0): rank(s) 4-7 swap across sockets (what crossing costs is not "
            "measured here)",
        ),
        # four ranks: the first four GPUs, all on socket 0 with the drives
        (
            {"nvme0n1": 0},
            4,
            "NUMA: node 0 112 CPUs, node 1 112 CPUs; rank(s) 0-3 on GPUs of node 0; the swept "
            "volume's drives on node 0 (nvme0n1 node 0): no rank's swaps cross sockets",
        ),
        # a RAID0 over both sockets' drives: every rank crosses for part of its swaps
        (
            {"nvme0n1": 0, "nvme8n1": 1},
            2,
            "NUMA: node 0 112 CPUs, node 1 112 CPUs; rank(s) 0-1 on GPUs of node 0; the swept "
            "volume stripes over drives of 2 sockets (nvme0n1 node 0, nvme8n1 node 1): every "
            "rank's swaps cross sockets for the share on the other socket's drives (what "
            "crossing costs is not measured here)",
        ),
        # more ranks than GPUs
        (
            {"nvme0n1": 1},
            10,
            "NUMA: node 0 112 CPUs, node 1 112 CPUs; rank(s) 0-3 on GPUs of node 0; rank(s) "
            "4-7 on GPUs of node 1 (the host has 8 GPU(s) for 10 ranks); the swept volume's "
            "drives on node 1 (nvme0n1 node 1): rank(s) 0-3 swap across sockets (what "
            "crossing costs is not measured here)",
        ),
        # the drive's node not known
        (
            {"nvme0n1": -1},
            8,
            "NUMA: node 0 112 CPUs, node 1 112 CPUs; the sockets of the GPUs or of the swept "
            "volume's drives are not known (nvme0n1 node ?)",
        ),
    ],
)
def test_the_plan_names_the_ranks_whose_swaps_cross_sockets(
    tmp_path: Path, disks: dict[str, int], ranks: int, note: str
) -> None:
    tree = _node(tmp_path, CPUS, PCI, disks)
    assert crossing_note(tree, list(disks), ranks, "the swept volume") == note


def test_one_socket_says_so_for_ranks_and_nothing_for_one(tmp_path: Path) -> None:
    tree = _node(tmp_path, {0: "0-1"}, PCI[:1], {"vda": -1})
    assert crossing_note(tree, ["vda"], 1, "the swept volume") is None
    assert crossing_note(tree, ["vda"], 2, "the swept volume") == (
        "NUMA: one node on this host: no rank's swaps cross sockets"
    )
    # this host, as the kernel shows it
    live = crossing_note(SysTree("/"), [], 2, "the swept volume")
    if len(numa_nodes(SysTree("/"))) <= 1:
        assert live == "NUMA: one node on this host: no rank's swaps cross sockets"
    else:
        assert live is not None and live.startswith("NUMA: node 0")
