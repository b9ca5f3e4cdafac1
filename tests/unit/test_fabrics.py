"""NVMe over Fabrics from sysfs (pure): a tree laid out as the kernel's NVMe host driver lays
it for a multipath head over TCP with two paths, one of them down, and for the target's
configfs; the vm tier reads the real thing (tests/vm/test_fabrics_vm.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from iotune.fabrics.connect import nsid_count
from iotune.plan.planner import parse_network
from iotune.probes.fabrics import (
    controllers_of,
    parse_address,
    read_fabric,
    target_exports,
)
from iotune.probes.sysfs import SysTree
from iotune.raid.plan import fabric_note

pytestmark = pytest.mark.unit

NQN = "nqn.2026-11.io.iotune:fabric"


def _put(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text + "\n")


def _link(root: Path, rel: str, target: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, p)


def fabric_tree(root: Path) -> SysTree:
    """nvme1n1: the head of a namespace shared by controllers nvme1 (tcp, live) and nvme2
    (tcp, connecting); its paths nvme1c1n1 and nvme1c2n1; a 25 Gb/s eth0; and the target
    side exporting nvme0n1 as namespace 1."""
    sub = "sys/devices/virtual/nvme-subsystem/nvme-subsys1"
    for c, state, addr in (
        ("nvme1", "live", "traddr=10.0.0.2,trsvcid=4420,src_addr=10.0.0.1"),
        ("nvme2", "connecting", "traddr=10.0.0.3,trsvcid=4420"),
    ):
        ctl = f"sys/devices/virtual/nvme-fabrics/ctl/{c}"
        _put(root, f"{ctl}/transport", "tcp")
        _put(root, f"{ctl}/address", addr)
        _put(root, f"{ctl}/subsysnqn", NQN)
        _put(root, f"{ctl}/state", state)
        _link(root, f"sys/class/nvme/{c}", f"../../devices/virtual/nvme-fabrics/ctl/{c}")
        _link(root, f"{sub}/{c}", f"../../nvme-fabrics/ctl/{c}")
        path = f"nvme1c{c[4:]}n1"
        _put(root, f"{ctl}/{path}/hidden", "1")
        _link(root, f"{ctl}/{path}/device", f"../../{c}")
        _link(root, f"sys/block/{path}", f"../devices/virtual/nvme-fabrics/ctl/{c}/{path}")
        _link(root, f"{sub}/nvme1n1/multipath/{path}", f"../../../../nvme-fabrics/ctl/{c}/{path}")
    _link(root, f"{sub}/nvme1n1/device", "../../nvme-subsys1")
    _link(root, "sys/block/nvme1n1", "../devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1")
    _put(root, "sys/class/net/eth0/speed", "25000")
    _put(root, "sys/class/net/lo/speed", "-1")  # a read that fails on the real lo
    ns = f"sys/kernel/config/nvmet/subsystems/{NQN}/namespaces"
    _put(root, f"{ns}/1/device_path", "/dev/nvme0n1")
    _put(root, f"{ns}/1/enable", "1")
    _put(root, f"{ns}/2/device_path", "/dev/nvme9n1")
    _put(root, f"{ns}/2/enable", "0")
    return SysTree(root)


def test_a_multipath_head_over_tcp_with_one_path_down(tmp_path: Path) -> None:
    tree = fabric_tree(tmp_path)
    assert controllers_of(tree, "nvme1n1") == ["nvme1", "nvme2"]
    f = read_fabric(tree, "nvme1n1", {"10.0.0.2": "eth0"}.get)
    assert f is not None
    assert (f.transport, f.nqn, f.state) == ("tcp", NQN, "live")
    assert [(p.controller, p.state, p.target) for p in f.paths] == [
        ("nvme1", "live", "10.0.0.2:4420"),
        ("nvme2", "connecting", "10.0.0.3:4420"),
    ]
    assert f.target == "10.0.0.2:4420, 10.0.0.3:4420"
    assert (f.iface, f.link_mbps, f.link_text()) == ("eth0", 25000, "eth0 25 Gb/s")
    assert f.link_bytes_s() == 25e9 / 8
    assert f.describe() == "nvme-tcp 10.0.0.2:4420, 10.0.0.3:4420 (eth0 25 Gb/s)"
    # a path's own controller: the hidden path device names it
    assert controllers_of(tree, "nvme1c2n1") == ["nvme2"]


def test_no_live_path_and_a_local_drive(tmp_path: Path) -> None:
    tree = fabric_tree(tmp_path)
    (tmp_path / "sys/devices/virtual/nvme-fabrics/ctl/nvme1/state").write_text("resetting\n")
    f = read_fabric(tree, "nvme1n1")
    assert f is not None and f.state == "resetting" and f.iface is None
    # a PCIe namespace: no fabric; a loop device: not NVMe at all
    _put(tmp_path, "sys/devices/pci0000:00/0000:00:04.0/nvme/nvme0/transport", "pcie")
    _link(tmp_path, "sys/class/nvme/nvme0", "../../devices/pci0000:00/0000:00:04.0/nvme/nvme0")
    _link(tmp_path, "sys/devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/device", "../../nvme0")
    _link(tmp_path, "sys/block/nvme0n1", "../devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1")
    assert controllers_of(tree, "nvme0n1") == ["nvme0"]
    assert read_fabric(tree, "nvme0n1") is None
    assert read_fabric(tree, "loop0") is None


def test_the_targets_exports_and_addresses(tmp_path: Path) -> None:
    tree = fabric_tree(tmp_path)
    assert target_exports(tree) == {"nvme0n1": [f"{NQN} namespace 1"]}
    assert target_exports(SysTree(tmp_path / "none")) == {}
    assert parse_address("traddr=fe80::1,trsvcid=4420,host_iface=eth1\n") == {
        "traddr": "fe80::1",
        "trsvcid": "4420",
        "host_iface": "eth1",
    }
    assert parse_address(None) == {}


def test_a_mixed_array_names_its_slowest_path(tmp_path: Path) -> None:
    from dataclasses import replace

    from iotune.probes.blockdev import BlockDevice, QueueLimits, Transport

    tree = fabric_tree(tmp_path)
    q = QueueLimits(None, None, None, None, None, None)
    local = BlockDevice(
        "nvme0n1", "/dev/nvme0n1", "259:0", Transport.NVME, "m", "s", "f", 1 << 30,
        512, 512, False, False, None, None, q,
    )  # fmt: skip
    fast = replace(
        local,
        name="nvme1n1",
        path="/dev/nvme1n1",
        fabric=read_fabric(tree, "nvme1n1", {"10.0.0.2": "eth0"}.get),
    )
    slow = replace(fast, name="nvme3n1", path="/dev/nvme3n1", fabric=read_fabric(tree, "nvme1n1"))
    assert fabric_note([local, local]) is None
    assert fabric_note([fast, slow]) is None  # all over the fabric: no mix
    note = fabric_note([local, fast, slow])
    assert note is not None and note.startswith(
        "warning: 1 local drive(s) and 2 NVMe-oF namespace(s)"
    )
    # the path that reports no link speed counts as the slowest
    assert note.endswith(
        "the slowest path: /dev/nvme3n1 over nvme-tcp 10.0.0.2:4420, 10.0.0.3:4420"
    )


@pytest.mark.parametrize(
    ("text", "gbit"),
    [("100G", 100), ("25GbE", 25), ("200Gb/s", 200), ("400 Gbit", 400), ("12.5g", 12.5)],
)
def test_the_network_links_rate(text: str, gbit: float) -> None:
    assert parse_network(text) == gbit * 1e9 / 8


def test_a_rate_that_is_not_one_is_refused() -> None:
    from iotune.errors import UsageError

    for bad in ("fast", "0G", "100MB"):
        with pytest.raises(UsageError, match=r"is not a rate|must be positive|a size, not a rate"):
            parse_network(bad)


def test_a_network_link_bounds_the_drives_plan() -> None:
    import json

    from click.testing import CliRunner

    from iotune import cli as cli_mod

    args = ["--json", "estimate", "opt_nvme_16b", "--baseline", "study"]
    args += ["--drive", "samsung-980-pro-2tb", "--drives", "1,2,8", "--network-link", "25G"]
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune")
    assert r.exit_code == 0, r.output
    rows = {p["drives"]: p for p in json.loads(r.output)["drives"]["plans"]}
    # one drive reads 5.02 GiB/s and writes 3.51: a 25 Gb/s link (2.91 GiB/s) binds them all
    assert all(p["bound_by"] == "network link" for p in rows.values())
    assert rows[8]["read_bw_bytes_s"] == rows[1]["read_bw_bytes_s"] == round(25e9 / 8)
    no = CliRunner().invoke(cli_mod.cli, ["estimate", "opt_nvme_16b", "--network-link", "25G"])
    assert no.exit_code == 2 and "--network-link bounds a drives plan" in no.output


def test_a_heads_paths_by_name_where_the_kernel_links_none(tmp_path: Path) -> None:
    """Kernels before 6.14 have no multipath/ links: the paths are found by their names."""
    import shutil

    from iotune.probes.fabrics import mpath_paths
    from iotune.trace.targets import expand

    tree = fabric_tree(tmp_path)
    assert mpath_paths(tree, "nvme1n1") == ["nvme1c1n1", "nvme1c2n1"]
    shutil.rmtree(tmp_path / "sys/devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1/multipath")
    assert mpath_paths(tree, "nvme1n1") == ["nvme1c1n1", "nvme1c2n1"]
    assert controllers_of(tree, "nvme1n1") == ["nvme1", "nvme2"]
    assert mpath_paths(tree, "nvme1c1n1") == [] and mpath_paths(tree, "loop0") == []
    _put(tmp_path, "sys/devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1/dev", "259:1")
    # a kernel whose hidden paths have no device number: refused, with the way out
    from iotune.errors import UsageError

    with pytest.raises(UsageError, match=r"paths \(nvme1c1n1, nvme1c2n1\) have no device"):
        expand(tree, "nvme1n1")
    for p in ("nvme1c1n1", "nvme1c2n1"):
        _put(tmp_path, f"sys/block/{p}/dev", "259:2")
    # trace follows the head to its paths, the head itself bio-based
    t = expand(tree, "nvme1n1")
    assert (t.disks, t.stacked) == (("nvme1c1n1", "nvme1c2n1"), ("nvme1n1",))


def test_a_link_speed_that_is_no_number_is_none(tmp_path: Path) -> None:
    from iotune.probes.fabrics import link_speed

    tree = fabric_tree(tmp_path)
    _put(tmp_path, "sys/class/net/eth1/speed", "unknown")
    assert link_speed(tree, "eth1") is None
    assert link_speed(tree, "lo") is None and link_speed(tree, "eth0") == 25000


def test_a_namespace_without_a_live_path_for_the_grace_stops_the_workload(
    tmp_path: Path,
) -> None:
    from iotune.trace.pathwatch import PathWatch

    tree = fabric_tree(tmp_path)
    w = PathWatch(tree, ("nvme1n1", "loop0"), grace_s=10.0)
    assert list(w.fabrics) == ["nvme1n1"]  # a loop device is no fabric: not watched
    state = tmp_path / "sys/devices/virtual/nvme-fabrics/ctl/nvme1/state"
    assert w.check(0.0) is None
    state.write_text("connecting\n")
    assert w.check(1.0) is None  # within the grace
    state.write_text("live\n")
    assert w.check(5.0) is None  # reconnected: the clock starts again
    state.write_text("connecting\n")
    assert w.check(6.0) is None and w.check(15.9) is None
    assert w.check(16.0) == (
        "nvme1n1 lost its path to nvme-tcp 10.0.0.2:4420, 10.0.0.3:4420: connecting for 10 s"
    )
    # disconnected: the namespace is gone at once
    (tmp_path / "sys/block/nvme1n1").unlink()
    assert PathWatch(tree, ()).check(0.0) is None
    assert w.check(16.5) == "nvme1n1 lost its path to nvme-tcp 10.0.0.2:4420, 10.0.0.3:4420: gone"


def test_a_run_stopped_on_a_lost_path_ends_in_one_line_with_its_records_named() -> None:
    """What `iotune trace`, `trace --run` and `run` say when the path watch stopped the
    workload (the vm tier's study stops a training run so: tests/vm/test_study_vm.py)."""
    from iotune.cli.options import exit_if_path_lost
    from iotune.errors import IotuneError

    exit_if_path_lost({"lost_path": None, "out": "/r"})  # nothing lost: nothing said
    lost = "nvme14n2 lost its path to nvme-tcp 127.0.0.1:4420: connecting for 10 s"
    with pytest.raises(IotuneError) as exc:
        exit_if_path_lost({"lost_path": lost, "out": "/tmp/trace-lost"})
    assert exc.value.message == f"stopped: {lost}; records kept in /tmp/trace-lost"
    assert exc.value.hint is not None and "iotune devices --all" in exc.value.hint
    assert "swap files" not in exc.value.hint  # a command's trace has none
    assert exc.value.exit_code == 1
    # a training run's swap files are left on the lost file system, and named
    swap = ["/mnt/fab/iotune-swap-r-1", "/mnt/fab2/iotune-swap-r-1"]
    with pytest.raises(IotuneError) as exc:
        exit_if_path_lost({"lost_path": lost, "out": "/r", "swap_dirs": swap})
    assert exc.value.hint is not None
    assert exc.value.hint.endswith(f"; the swap files are left in {swap[0]}, {swap[1]}")


def _md_over_a_lost_namespace(root: Path) -> Path:
    """The recorded QEMU guest (md127 over nvme2n1) copied to *root*, with nvme2 a TCP
    controller that is connecting; its sysfs folder."""
    shutil.copytree(Path(__file__).parent.parent / "data" / "qemu-nvme", root, symlinks=True)
    ctl = root / "sys/devices/pci0000:00/0000:00:0c.0/nvme/nvme2"
    for key, value in (
        ("transport", "tcp"),
        ("state", "connecting"),
        ("address", "traddr=10.0.0.2,trsvcid=4420"),
        ("subsysnqn", NQN),
    ):
        (ctl / key).write_text(value + "\n")
    _link(root, "sys/class/nvme/nvme2", "../../devices/pci0000:00/0000:00:0c.0/nvme/nvme2")
    return ctl


def test_an_array_over_a_namespace_without_a_live_path_is_not_probed(tmp_path: Path) -> None:
    """md127 of the recorded QEMU guest holds IOT2 (nvme2n1); with nvme2n1 a namespace over
    TCP whose controller is connecting, a read of either would wait on the lost path for
    minutes (ctrl_loss_tmo): neither is probed for signatures or an exclusive open, and the
    namespace says it has no live path. The other drives are probed as always."""
    from iotune.probes.blockdev import Use, find_block_devices
    from iotune.probes.host import RecordedHost, Signature

    _md_over_a_lost_namespace(tmp_path / "h")
    probed: list[str] = []

    class Watched(RecordedHost):
        def signatures(self, name: str) -> list[Signature]:
            probed.append(name)
            return super().signatures(name)

        def exclusive_open_error(self, name: str) -> str | None:
            probed.append(name)
            return super().exclusive_open_error(name)

    devs = {d.name: d for d in find_block_devices(Watched(tmp_path / "h"))}
    assert devs["md127"].slaves and "nvme2n1" in devs["md127"].slaves
    assert "nvme2n1" not in probed and "md127" not in probed, probed
    assert {"nvme0n1", "nvme1n1", "nvme3n1"} <= set(probed)
    (reason,) = [r for r in devs["nvme2n1"].in_use if r.kind is Use.NOT_LIVE]
    assert reason.detail.startswith("no live path to nvme-tcp 10.0.0.2:4420 ("), reason


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ('{"nsid_list": [{"nsid": 1}, {"nsid": 2}]}', 2),
        ("{}", 0),  # nvme-cli leaves the list out when no namespace is active
        ("", None),
        ("[0]:0x1", None),  # the plain output, not JSON
        ('{"nsid_list": 3}', None),
    ],
)
def test_the_controllers_active_namespaces_from_nvme_list_ns(text: str, count: int | None) -> None:
    """`fabrics connect` waits for as many namespaces as the controller reports active (the
    kernel scans them one by one after the connect returns: seen in the vm guest, a second
    namespace a moment after the first)."""
    assert nsid_count(text) == count


def test_raid_status_reads_no_array_over_a_namespace_without_a_live_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """md127 of the recorded QEMU guest over nvme2n1, a TCP namespace whose controller is
    connecting: blkid's read of the array would wait for ctrl_loss_tmo, so it is not run;
    the status names the namespace. With the path live again, blkid reads it as always."""
    from iotune.probes.host import RecordedHost
    from iotune.raid import host as raid_host

    ctl = _md_over_a_lost_namespace(tmp_path / "h")
    read: list[str] = []

    def blkid(dev: str) -> dict[str, str]:
        read.append(dev)
        return {"TYPE": "xfs"}

    monkeypatch.setattr(raid_host, "_blkid", blkid)
    host = RecordedHost(tmp_path / "h")
    info = raid_host.array_info(host, "md127")
    assert read == [] and info.lost_path == "nvme2n1" and info.fs is None, info
    (ctl / "state").write_text("live\n")
    info = raid_host.array_info(host, "md127")
    assert read == ["/dev/md127"] and info.lost_path is None and info.fs == "xfs", info


def test_a_workload_on_a_namespace_without_a_live_path_is_not_started(tmp_path: Path) -> None:
    """Its first request would wait for ctrl_loss_tmo: what a trace with a command, a run,
    a sweep and a checkpoint folder are refused on before anything starts (the refusals
    themselves: the vm lab, tests/vm/test_fabric_training_vm.py)."""
    from iotune.trace.pathwatch import PathWatch

    tree = fabric_tree(tmp_path)
    w = PathWatch(tree, ("nvme1n1",))
    assert w.not_live() is None  # one of its two paths is live
    (tmp_path / "sys/devices/virtual/nvme-fabrics/ctl/nvme1/state").write_text("resetting\n")
    assert w.not_live() == (
        "nvme1n1 has no live path to nvme-tcp 10.0.0.2:4420, 10.0.0.3:4420 (resetting)"
    )

    from iotune.probes.fabrics import lost_behind

    _md_over_a_lost_namespace(tmp_path / "h")
    h = SysTree(tmp_path / "h")
    _link(tmp_path / "h", "sys/dev/block/9:127", "../../block/md127")
    _link(tmp_path / "h", "sys/dev/block/259:0", "../../block/nvme0n1")
    # a file system on the array over the namespace, and the namespace's own device
    lost = "nvme2n1, which has no live path to nvme-tcp 10.0.0.2:4420 (connecting)"
    assert lost_behind(h, os.makedev(9, 127)) == lost
    # a local drive's, tmpfs's (major 0), a device this host does not have
    assert lost_behind(h, os.makedev(259, 0)) is None
    assert lost_behind(h, os.makedev(0, 45)) is None
    assert lost_behind(h, os.makedev(8, 1)) is None


# ------------------------------------------------- fabrics connect: FC's host port, same place


def _controller(transport: str, address: str, nqn: str = NQN) -> Any:
    from iotune.fabrics.connect import Controller
    from iotune.probes.fabrics import FabricPath

    a = parse_address(address)
    host = {"host_traddr": a["host_traddr"]} if "host_traddr" in a else {}
    path = FabricPath("nvme4", transport, a.get("traddr"), a.get("trsvcid"), "live", **host)
    return Controller("nvme4", nqn, path)


FC_T = "nn-0x20000090fa942779:pn-0x10000090fa942779"
FC_H = "nn-0x20000090fa94277a:pn-0x10000090fa94277a"


@pytest.mark.parametrize(
    ("target", "host", "address", "same"),
    [
        ("tcp://10.0.0.1", None, "traddr=10.0.0.1,trsvcid=4420", True),
        # the kernel keeps the address as nvme-cli gave it (nvmf_get_address prints opts)
        ("tcp://10.0.0.1", None, "traddr=10.000.0.1,trsvcid=4420,src_addr=10.0.0.9", True),
        ("tcp://10.0.0.1", None, "traddr=10.0.0.1,trsvcid=04420", True),
        ("tcp://[::1]", None, "traddr=0:0::1,trsvcid=4420", True),
        ("tcp://[fd00::a]", None, "traddr=FD00:0::A,trsvcid=4420", True),
        ("tcp://10.0.0.1", None, "traddr=10.0.0.10,trsvcid=4420", False),
        ("tcp://10.0.0.1:4421", None, "traddr=10.0.0.1,trsvcid=4420", False),
        ("tcp://10.0.0.1", "10.0.0.9", "traddr=10.0.0.1,trsvcid=4420,host_traddr=10.0.0.9", True),
        ("tcp://10.0.0.1", "10.0.0.9", "traddr=10.0.0.1,trsvcid=4420,host_traddr=10.0.0.8", False),
        (
            f"fc://{FC_T}",
            FC_H,
            f"traddr={FC_T.upper().replace('X', 'x').replace('NN', 'nn').replace('PN', 'pn')},host_traddr={FC_H}",
            True,
        ),
        (f"fc://{FC_T}", FC_H, f"traddr={FC_T.replace('-0x', '-')},host_traddr={FC_H}", True),
        (f"fc://{FC_T}", FC_H, f"traddr={FC_T},host_traddr={FC_T}", False),  # another host port
    ],
)
def test_already_connected_compares_addresses_as_the_kernel_reads_them(
    target: str, host: str | None, address: str, same: bool
) -> None:
    from iotune.fabrics.connect import same_place
    from iotune.fabrics.target import parse_target

    t = parse_target(target, host) if host else parse_target(target)
    assert same_place(_controller(t.transport, address), t, NQN) is same
    assert same_place(_controller(t.transport, address), t, "nqn.other") is False
    other = "rdma" if t.transport == "tcp" else "tcp"
    assert same_place(_controller(other, address), t, NQN) is False


def test_a_target_named_by_host_name_is_the_addresses_it_resolves_to() -> None:
    """nvme-cli resolves a TCP host name before the kernel sees it: sysfs holds the address."""
    from iotune.fabrics.connect import same_place
    from iotune.fabrics.target import parse_target

    t = parse_target("tcp://flash-a.example")
    here = _controller("tcp", "traddr=10.0.0.2,trsvcid=4420")
    assert same_place(here, t, NQN, resolve=lambda name: ["10.0.0.2", "fd00::2"]) is True
    assert same_place(here, t, NQN, resolve=lambda name: ["10.0.0.3"]) is False


def _fake_nvme(monkeypatch: pytest.MonkeyPatch, there: list[Any], offers: str) -> list[list[str]]:
    """`fabrics connect` with nvme-cli, the module and the root check stood in for; the argv
    of every program it runs."""
    import subprocess

    from iotune.fabrics import connect as fc

    ran: list[list[str]] = []

    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        ran.append(list(argv))
        out = offers if argv[:2] == ["nvme", "discover"] else '{"device": "nvme4"}'
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr("iotune.proc.run", run)
    monkeypatch.setattr(fc, "need_nvme_cli", lambda: None)
    monkeypatch.setattr(fc, "load_module", lambda target, tree: None)
    monkeypatch.setattr(fc, "controllers", lambda tree: there)
    monkeypatch.setattr(fc, "namespaces_of", lambda tree, nqn: ["nvme4n1"])
    monkeypatch.setattr("iotune.cli.fabrics.os.geteuid", lambda: 0)
    return ran


def _offers(transport: str, traddr: str) -> str:
    import json

    return json.dumps(
        {
            "records": [
                {"trtype": transport, "subtype": "nvme subsystem", "subnqn": NQN, "traddr": traddr}
            ]
        }
    )


def test_fabrics_connect_over_fc_passes_the_hosts_port_to_discover_and_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    from iotune import cli as cli_mod

    ran = _fake_nvme(monkeypatch, [], _offers("fc", FC_T))
    args = ["fabrics", "connect", f"fc://{FC_T}", "--host-traddr", FC_H]
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune")
    assert r.exit_code == 0, r.output
    assert ran[0] == ["nvme", "discover", "-t", "fc", "-a", FC_T, "-w", FC_H, "-o", "json"]
    assert ran[1] == [
        "nvme",
        "connect",
        "-t",
        "fc",
        "-a",
        FC_T,
        "-w",
        FC_H,
        "-n",
        NQN,
        "-o",
        "json",
    ]
    assert f"connected {NQN} at fc://{FC_T} as nvme4: /dev/nvme4n1" in r.stdout
    r = CliRunner().invoke(cli_mod.cli, ["fabrics", "connect", f"fc://{FC_T}"], prog_name="iotune")
    assert r.exit_code == 2 and "needs --host-traddr" in r.stderr and "hint: " in r.stderr


@pytest.mark.parametrize(
    ("target", "address"),
    [
        ("tcp://10.0.0.1", "traddr=10.000.0.1,trsvcid=4420"),
        ("tcp://[::1]", "traddr=0:0::1,trsvcid=4420"),
        (
            f"fc://{FC_T}",
            f"traddr={FC_T.replace('0x2', '0X2').replace('fa', 'FA')},host_traddr={FC_H}",
        ),
    ],
)
def test_fabrics_connect_leaves_a_subsystem_connected_under_another_spelling(
    target: str, address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from iotune import cli as cli_mod
    from iotune.fabrics.target import parse_target

    t = parse_target(target, FC_H) if target.startswith("fc") else parse_target(target)
    ran = _fake_nvme(monkeypatch, [_controller(t.transport, address)], _offers(t.transport, "x"))
    monkeypatch.setattr("iotune.fabrics.connect.check_answers", lambda target: None)
    args = ["fabrics", "connect", target, "--nqn", NQN]
    if target.startswith("fc"):
        args += ["--host-traddr", FC_H]
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune")
    assert r.exit_code == 0, r.output
    assert "is already connected (nvme4): /dev/nvme4n1" in r.stdout, r.stdout
    assert [a[:2] for a in ran] == [["nvme", "discover"]]  # no second connect


def test_a_controllers_host_port_is_read_and_this_hosts_fc_ports_are_listed(tmp_path: Path) -> None:
    from iotune.probes.fabrics import fc_host_ports, read_path

    ctl = "sys/devices/virtual/nvme-fabrics/ctl/nvme5"
    _put(tmp_path, f"{ctl}/transport", "fc")
    _put(tmp_path, f"{ctl}/address", f"traddr={FC_T},host_traddr={FC_H}")
    _put(tmp_path, f"{ctl}/state", "live")
    _link(tmp_path, "sys/class/nvme/nvme5", "../../devices/virtual/nvme-fabrics/ctl/nvme5")
    tree = SysTree(tmp_path)
    p = read_path(tree, "nvme5")
    assert (p.traddr, p.trsvcid, p.host_traddr, p.target) == (FC_T, None, FC_H, FC_T)
    for host, state in (("host3", "Online"), ("host4", "Linkdown")):
        base = f"sys/devices/pci0000:00/0000:00:05.0/{host}/fc_host/{host}"
        _put(tmp_path, f"{base}/node_name", "0x20000090fa94277a")
        _put(
            tmp_path,
            f"{base}/port_name",
            "0x10000090fa94277a" if host == "host3" else "0x10000090fa94277b",
        )
        _put(tmp_path, f"{base}/port_state", state)
        _link(
            tmp_path,
            f"sys/class/fc_host/{host}",
            f"../../devices/pci0000:00/0000:00:05.0/{host}/fc_host/{host}",
        )
    assert fc_host_ports(tree) == [FC_H]
    assert fc_host_ports(SysTree(tmp_path / "none")) == []
