"""`iotune trace` on md RAID0 over emulated NVMe drives: requests appear on the members,
none on md (bio-based), and the array's figures are the sum over its members."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.vm.conftest import Session

pytestmark = pytest.mark.beside_study

K = 1024
MEMBERS = ("IOT0", "IOT4", "IOT5")


@pytest.fixture(scope="module")
def raid0(vm: Session) -> Iterator[str]:
    devs = [vm.dev(s) for s in MEMBERS]
    vm.guest.run(
        [
            "mdadm",
            "--create",
            "/dev/md/r0",
            "--level=0",
            "--raid-devices=3",
            "--chunk=64K",
            "--metadata=1.2",
            "--run",
            *devs,
        ]
    ).check()
    # No waiting for the kernel's own reads of the new array (partition scan) to finish:
    # some are still in flight when tracing starts, and the cross-check accounts for them.
    yield "/dev/md/r0"
    vm.guest.run(["mdadm", "--stop", "/dev/md/r0"]).check()
    vm.guest.run(["mdadm", "--zero-superblock", *devs]).check()


@pytest.fixture(scope="module")
def traced(vm: Session, raid0: str) -> dict[str, Any]:
    # 48 sequential 64 KiB direct writes = 16 full stripes: exactly 16 chunk-sized
    # requests on each member
    r = vm.guest.iotune(
        "--json",
        "trace",
        "--target",
        raid0,
        "--out",
        "/tmp/trace-r0",
        "--",
        "fio",
        "--name=w",
        f"--filename={raid0}",
        "--direct=1",
        "--ioengine=psync",
        "--rw=write",
        "--bs=64k",
        f"--size={48 * 64}k",
        timeout=600,
    ).check()
    return dict(json.loads(r.stdout))


def test_requests_land_on_the_members_not_on_md(traced: dict[str, Any], vm: Session) -> None:
    # the guest's 6.1 kernel has BTF: auto takes the CO-RE object through libbpf
    assert traced["backend"] == "libbpf" and traced["probes"] == "tp_btf"
    members = sorted(vm.dev(s).removeprefix("/dev/") for s in MEMBERS)
    devs = {d["name"]: d for d in traced["devices"]}
    md = [d for d in traced["devices"] if d["stacked"]]
    assert len(md) == 1 and md[0]["name"].startswith("md")
    assert md[0]["write"]["requests"] == 0 and md[0]["read"]["requests"] == 0
    # md counts bios in its diskstats, which are not requests: no cross-check there
    assert md[0]["check"] == {
        "exact": None,
        "summary": "bio-based: requests are counted on its members",
    }
    assert md[0]["diskstats"]["write_bytes"] == 48 * 64 * K
    assert sorted(n for n, d in devs.items() if not d["stacked"]) == members
    for name in members:
        w = devs[name]["write"]
        assert w["sizes"] == {str(64 * K): 16}, (name, w["sizes"])
        assert devs[name]["chunk_bytes"] == 64 * K
        # exact, or apart by no more than the events the kernel skipped delivering (a virtio
        # completion interrupt that lands while the tracer's issue program runs) and says so
        chk = devs[name]["check"]
        assert chk["exact"] or chk["summary"].startswith("consistent: "), chk


def test_array_total_is_the_member_sum(traced: dict[str, Any]) -> None:
    (array,) = traced["arrays"]
    assert array["level"] == "raid0" and array["chunk_bytes"] == 64 * K
    members = [d for d in traced["devices"] if d["name"] in array["members"]]
    assert len(members) == 3
    for op in ("read", "write"):
        assert array[op]["requests"] == sum(m[op]["requests"] for m in members)
        assert array[op]["bytes"] == sum(m[op]["bytes"] for m in members)
    assert array["write"]["bytes"] == 48 * 64 * K
    assert array["write"]["sizes"] == {str(64 * K): 48}
    assert traced["exit_code"] == 0
