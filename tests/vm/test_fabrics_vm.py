"""NVMe over Fabrics in the vm guest: the kernel's own target (nvmet-tcp) exports two emulated
drives on 127.0.0.1, `iotune fabrics connect` finds the subsystem in the target's discovery
log and connects it (a port nothing listens on, and a subsystem the target does not offer,
refused in one line; `fabrics disconnect` refused while an array holds them), and iotune sees
the two namespaces over TCP: in
`devices` (transport, target, subsystem, state, paths, link), in `raid create` (a RAID0 over
both), and in `trace` (each request counted on the namespace's path, exact against the
kernel's counters). A path lost under a workload (a training run), and the namespaces then
refused by `raid create`: tests/vm/test_fabric_training_vm.py."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.vm.conftest import Session

pytestmark = pytest.mark.beside_study

NQN = "nqn.2026-11.io.iotune:fabric"
PORT = "1"
TARGET = str(Path(__file__).resolve().parent / "nvmet_target.py")
BACKING = ("FAB0", "FAB1")
K = 1024


def _namespaces(vm: Session) -> list[str]:
    """The fabric namespaces' block devices (heads), from sysfs in the guest."""
    script = (
        "import glob, os\n"
        "for d in sorted(glob.glob('/sys/block/nvme*n*')):\n"
        "    if os.path.exists(d + '/hidden') and open(d + '/hidden').read().strip() == '1':\n"
        "        continue\n"
        "    ctl = glob.glob(d + '/device/nvme*/subsysnqn') + glob.glob(d + '/device/subsysnqn')\n"
        f"    if any(open(c).read().strip() == {NQN!r} for c in ctl):\n"
        "        print(os.path.basename(d))\n"
    )
    out = vm.guest.run([sys.executable, "-c", script]).check().stdout
    return out.split()


def _devices(vm: Session, *names: str) -> dict[str, Any]:
    doc = vm.iotune_json("devices", "--all", *(f"/dev/{n}" for n in names))
    return {d["name"]: d for d in doc["devices"]}


@pytest.fixture(scope="module")
def fabric(vm: Session) -> Iterator[list[str]]:
    backing = [vm.dev(s) for s in BACKING]
    py = sys.executable
    vm.guest.run([py, TARGET, "up", NQN, "127.0.0.1", PORT, *backing]).check()
    # the one subsystem the target's discovery log offers, connected with its namespaces
    done = vm.iotune_json("fabrics", "connect", "tcp://127.0.0.1")
    assert (done["nqn"], done["target"], done["connected"]) == (NQN, "tcp://127.0.0.1:4420", True)
    names = _namespaces(vm)
    assert sorted(done["namespaces"]) == names and len(names) == 2, (done, names)
    yield names
    gone = vm.iotune_json("fabrics", "disconnect", NQN, "--yes")
    assert gone["disconnected"] == 1 and sorted(gone["namespaces"]) == names, gone
    assert _namespaces(vm) == []
    vm.guest.run([py, TARGET, "down", NQN, PORT]).check()


def test_a_target_that_is_not_there_or_does_not_offer_the_subsystem_is_one_line(
    vm: Session, fabric: list[str]
) -> None:
    again = vm.iotune_json("fabrics", "connect", "tcp://127.0.0.1:4420", "--nqn", NQN)
    assert again["connected"] is False and sorted(again["namespaces"]) == fabric, again
    cases = {
        # nothing listens on 4421
        ("tcp://127.0.0.1:4421", NQN): "iotune: error: tcp://127.0.0.1:4421 does not answer "
        "(connection refused: nothing listens there)",
        ("tcp://127.0.0.1:4420", "nqn.2026-11.io.iotune:none"): "iotune: error: "
        "tcp://127.0.0.1:4420 offers no subsystem nqn.2026-11.io.iotune:none (it offers "
        f"{NQN})",
    }
    for (where, nqn), line in cases.items():
        r = vm.guest.iotune("fabrics", "connect", where, "--nqn", nqn)
        lines = r.stderr.strip().splitlines()
        assert r.rc in (1, 2) and lines[0] == line and len(lines) == 2, r.stderr
        assert lines[1].startswith("hint: ")
    assert _namespaces(vm) == fabric


def test_devices_shows_each_namespace_over_tcp_and_the_drives_it_exports(
    vm: Session, fabric: list[str]
) -> None:
    devs = _devices(vm, *fabric, *(vm.dev(s).removeprefix("/dev/") for s in BACKING))
    for name in fabric:
        d = devs[name]
        f = d["fabric"]
        assert d["transport"] == "nvme" and f["transport"] == "tcp"
        assert (f["nqn"], f["state"], f["target"]) == (NQN, "live", "127.0.0.1:4420")
        assert len(f["paths"]) == 1 and f["paths"][0]["state"] == "live"
        assert f["iface"] == "lo" and f["link_mbps"] is None  # loopback reports no speed
        assert d["in_use"] == [], d["in_use"]
    # the drives behind the target are in use: exported, never to be put in an array
    for i, serial in enumerate(BACKING, 1):
        d = devs[vm.dev(serial).removeprefix("/dev/")]
        assert d["fabric"] is None
        assert {
            "kind": "exported",
            "detail": f"exported by this host's NVMe-oF target as {NQN} namespace {i}",
        } in d["in_use"]
    text = vm.guest.iotune("devices", "--all").check().stdout
    assert "NVMe over Fabrics" in text and "nvme-tcp" in text


def test_a_raid0_over_two_tcp_namespaces_is_traced_exactly_on_their_paths(
    vm: Session, fabric: list[str]
) -> None:
    devs = [f"/dev/{n}" for n in fabric]
    # with a local drive beside them: planned, with the warning naming the slower path
    mixed = vm.guest.iotune(
        "--json", "raid", "create", devs[0], vm.dev("IOT0"), "--name", "mix", "--dry-run"
    ).check()
    notes = json.loads(mixed.stdout)["plan"]["notes"]
    assert any(
        f"the slowest path: {devs[0]} over nvme-tcp 127.0.0.1:4420 (lo)" in n for n in notes
    ), notes
    done = vm.iotune_json(
        "raid", "create", *devs, "--name", "fab", "--chunk", "64K", "--fs", "none", "--yes"
    )
    assert done["applied"] is True
    try:
        # members of an array: the subsystem is not disconnected under it
        r = vm.guest.iotune("fabrics", "disconnect", NQN, "--yes")
        assert r.rc == 1 and f"refusing to disconnect {NQN}: /dev/" in r.stderr, r.stderr
        assert "held by md" in r.stderr.splitlines()[0], r.stderr
        r = vm.guest.iotune(
            "--json", "trace", "--target", "/dev/md/fab", "--out", "/tmp/trace-fab", "--",
            "dd", "if=/dev/zero", "of=/dev/md/fab", "bs=128K", "count=32", "oflag=direct",
            timeout=600,
        ).check()  # fmt: skip
        traced = json.loads(r.stdout)
    finally:
        vm.iotune_json("raid", "destroy", "fab", "--yes")
    by = {d["name"]: d for d in traced["devices"]}
    leaves = [n for n, d in by.items() if not d["stacked"]]
    # the requests land on each namespace (the guest loads nvme_core with multipath=N: see
    # tests/vm/conftest.py); md is bio-based
    assert sorted(leaves) == sorted(fabric), sorted(by)
    for n in leaves:
        w = by[n]["write"]
        # 32 writes of 128 KiB over two members in 64 KiB chunks: 32 chunk writes each
        assert w["sizes"] == {str(64 * K): 32}, (n, w["sizes"])
        chk = by[n]["check"]
        assert chk["exact"] or chk["summary"].startswith("consistent: "), chk
    (array,) = traced["arrays"]
    assert array["write"]["bytes"] == 32 * 128 * K


NQN_RDMA = "nqn.2026-11.io.iotune:rdma"
RDMA_ADDR, RDMA_PORT = "10.77.0.1", "2"


@pytest.fixture(scope="module")
def rdma_fabric(vm: Session) -> Iterator[str]:
    """FAB2 exported over NVMe/RDMA on soft-RoCE (rdma_rxe on a veth end), connected with
    `iotune fabrics connect rdma://...`: the one subsystem the target offers there."""
    py = sys.executable
    vm.guest.run([py, TARGET, "rxe", RDMA_ADDR]).check()
    try:
        up = [py, TARGET, "up-rdma", NQN_RDMA, RDMA_ADDR, RDMA_PORT, vm.dev("FAB2")]
        vm.guest.run(up).check()
        done = vm.iotune_json("fabrics", "connect", f"rdma://{RDMA_ADDR}")
        assert (done["nqn"], done["connected"]) == (NQN_RDMA, True), done
        (name,) = done["namespaces"]
        yield name
        vm.guest.run(["nvme", "disconnect", "-n", NQN_RDMA]).check()
        vm.guest.run([py, TARGET, "down", NQN_RDMA, RDMA_PORT]).check()
    finally:
        vm.guest.run([py, TARGET, "rxe-down"])


def test_a_namespace_over_rdma_is_shown_and_traced_exactly(vm: Session, rdma_fabric: str) -> None:
    name = rdma_fabric
    d = _devices(vm, name)[name]
    f = d["fabric"]
    assert d["transport"] == "nvme" and f["transport"] == "rdma", f
    assert (f["nqn"], f["state"], f["target"]) == (NQN_RDMA, "live", f"{RDMA_ADDR}:4420"), f
    assert len(f["paths"]) == 1 and f["paths"][0]["state"] == "live", f
    r = vm.guest.iotune(
        "--json", "trace", "--target", f"/dev/{name}", "--out", "/tmp/trace-rdma", "--",
        "dd", "if=/dev/zero", f"of=/dev/{name}", "bs=128K", "count=32", "oflag=direct",
        timeout=600,
    ).check()  # fmt: skip
    by = {x["name"]: x for x in json.loads(r.stdout)["devices"]}
    w = by[name]["write"]
    # every request the namespace took, by exact size, adds up to what dd wrote
    assert w["bytes"] == 32 * 128 * K, w
    assert sum(int(size) * n for size, n in w["sizes"].items()) == 32 * 128 * K, w["sizes"]
    chk = by[name]["check"]
    assert chk["exact"] or chk["summary"].startswith("consistent: "), chk
