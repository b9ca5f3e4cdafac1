"""`iotune raid` against real mdadm, a real kernel and emulated NVMe drives in the guest."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.vm.conftest import KEEP, Session

pytestmark = pytest.mark.beside_study

K = 1024


def raid(vm: Session, *args: str, ok: bool = True) -> Any:
    r = vm.guest.iotune("--json", "raid", *args, timeout=600)
    if ok:
        r.check()
    return r


def free(vm: Session, *serials: str) -> None:
    """The drives carry no signature, no holder, nothing: as blank as before."""
    listing = {d["serial"]: d for d in vm.iotune_json("devices")["devices"]}
    for s in serials:
        assert listing[s]["in_use"] == [], (s, listing[s]["in_use"])
        assert vm.guest.run(["mdadm", "--examine", vm.dev(s)]).rc != 0, (
            f"{s} still has an md superblock"
        )


def eventually(cond: Callable[[], bool], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def py(vm: Session, code: str) -> str:
    return vm.guest.run([sys.executable, "-c", code]).check().stdout


def test_raid0_create_use_status_destroy(vm: Session) -> None:
    devs = [vm.dev(s) for s in ("IOT6", "IOT7", "IOT8")]
    doc = json.loads(raid(vm, "create", *devs, "--mount", "/tmp/offload", "--yes").stdout)
    assert doc["applied"] is True
    assert doc["array"]["level"] == "raid0" and doc["array"]["mountpoints"] == ["/tmp/offload"]
    # write a file through the volume, drop caches, read it back
    digest = py(
        vm,
        (
            "import hashlib, os\n"
            "data = os.urandom(8 << 20)\n"
            "open('/tmp/offload/blob', 'wb').write(data); os.sync()\n"
            "print(hashlib.sha256(data).hexdigest())\n"
        ),
    ).strip()
    vm.guest.run(["sysctl", "-q", "vm.drop_caches=3"]).check()
    again = py(
        vm,
        "import hashlib; print(hashlib.sha256(open('/tmp/offload/blob','rb').read()).hexdigest())",
    )
    assert again.strip() == digest

    status = json.loads(raid(vm, "status", "offload").stdout)["arrays"][0]
    assert status["device"] == "/dev/md/offload"
    assert (status["level"], status["chunk_bytes"], status["fs"]) == ("raid0", 512 * K, "xfs")
    assert status["minimum_io_size"] == 512 * K and status["optimal_io_size"] == 3 * 512 * K
    assert sorted(m["serial"] for m in status["members"]) == ["IOT6", "IOT7", "IOT8"]
    assert all(m["model"] == "QEMU NVMe Ctrl" for m in status["members"])
    assert status["state"] in ("clean", "active", "active-idle")
    xfs = vm.guest.run(["xfs_info", "/tmp/offload"]).check().stdout
    assert "sunit=128" in xfs and "swidth=384 blks" in xfs

    # the same create again: reported, nothing changed
    same = json.loads(raid(vm, "create", *devs, "--mount", "/tmp/offload", "--yes").stdout)
    assert same["changed"] is False

    # busy volume: a process working inside it blocks destroy
    pid = py(
        vm,
        (
            "import subprocess\n"
            "p = subprocess.Popen(['sleep', '120'], cwd='/tmp/offload', start_new_session=True,\n"
            "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
            "print(p.pid)\n"
        ),
    ).strip()
    busy = raid(vm, "destroy", "offload", "--yes", ok=False)
    assert busy.rc == 1
    assert f"pid {pid} (sleep) works in /tmp/offload" in busy.stderr
    vm.guest.run(["kill", pid]).check()

    done = json.loads(raid(vm, "destroy", "offload", "--yes").stdout)
    assert done["applied"] is True
    assert [s["kind"] for s in done["plan"]] == ["umount", "stop", "zero"]
    free(vm, "IOT6", "IOT7", "IOT8")


def test_drives_in_use_are_refused_and_left_intact(vm: Session) -> None:
    cases = {
        "IOT3": "is mounted at /tmp/iot3 (ext4)",
        "IOT1": "ext4 signature on",
        "IOT2": "held by md127",
    }
    for serial, reason in cases.items():
        r = raid(vm, "create", vm.dev(serial), vm.dev("IOT6"), vm.dev("IOT7"), "--yes", ok=False)
        assert r.rc == 1, r.stderr
        assert "refusing to build /dev/md/offload" in r.stderr
        assert f"{vm.dev(serial)}: " in r.stderr and reason in r.stderr, r.stderr
    # nothing was touched: the blank drives are still blank, the file is still there
    free(vm, "IOT6", "IOT7")
    vm.guest.run(["mkdir", "-p", "/tmp/iot1"]).check()
    vm.guest.run(["mount", "-o", "ro", vm.dev("IOT1"), "/tmp/iot1"]).check()
    try:
        assert vm.guest.run(["cat", "/tmp/iot1/keep.txt"]).check().stdout == KEEP
    finally:
        vm.guest.run(["umount", "/tmp/iot1"]).check()
    mdstat = vm.guest.run(["cat", "/proc/mdstat"]).check().stdout
    assert "offload" not in mdstat and mdstat.count(" : active") == 1  # only md127 (held)


def test_wipe_erases_a_stale_signature(vm: Session) -> None:
    stale, other = vm.dev("IOT10"), vm.dev("IOT9")
    refused = raid(vm, "create", stale, other, "--fs", "none", "--name", "w", "--yes", ok=False)
    assert refused.rc == 1 and "--wipe erases signatures" in refused.stderr
    doc = json.loads(
        raid(vm, "create", stale, other, "--fs", "none", "--name", "w", "--wipe", "--yes").stdout
    )
    wipe = doc["plan"]["steps"][0]
    assert wipe["argv"] == ["wipefs", "--all", stale] and "ext4 at 0x438" in wipe["why"]
    raid(vm, "destroy", "w", "--yes")
    free(vm, "IOT10", "IOT9")


def test_failure_mid_apply_leaves_no_array(vm: Session) -> None:
    devs = [vm.dev(s) for s in ("IOT6", "IOT7")]
    r = raid(vm, "create", *devs, "--mount", "/tmp/broken", "--mkfs-opt=-Z", "--yes", ok=False)
    assert r.rc == 1
    assert "step 'mkfs.xfs" in r.stderr and "rolled back: array /dev/md/offload" in r.stderr
    assert "offload" not in vm.guest.run(["ls", "/dev/md"]).stdout
    assert vm.guest.run(["cat", "/proc/mdstat"]).check().stdout.count(" : active") == 1
    free(vm, "IOT6", "IOT7")


def test_persist_survives_a_rescan(vm: Session) -> None:
    devs = [vm.dev(s) for s in ("IOT6", "IOT7", "IOT8")]
    doc = json.loads(
        raid(
            vm, "create", *devs, "--name", "pers", "--mount", "/tmp/pers", "--persist", "--yes"
        ).stdout
    )
    plan = doc["plan"]
    conf = next(s for s in plan["steps"] if s["kind"] == "conf")
    fstab = next(s for s in plan["steps"] if s["kind"] == "fstab")
    assert conf["line"] in vm.guest.run(["cat", conf["path"]]).check().stdout
    assert fstab["line"] in vm.guest.run(["cat", "/etc/fstab"]).check().stdout
    assert fstab["line"].startswith(f"UUID={plan['fs_uuid']} /tmp/pers xfs noatime")
    assert any("initramfs" in n for n in plan["notes"])  # /boot is read-only in the guest
    # stop it, then let mdadm find it again from mdadm.conf alone
    vm.guest.run(["umount", "/tmp/pers"]).check()
    vm.guest.run(["mdadm", "--stop", "/dev/md/pers"]).check()
    # without udev, the kernel removes and adds md nodes a moment after mdadm returns
    assert eventually(lambda: "pers" not in vm.guest.run(["ls", "/dev/md"]).stdout.split())
    vm.guest.run(["mdadm", "--assemble", "--scan"])
    assert eventually(lambda: "pers" in vm.guest.run(["ls", "/dev/md"]).stdout.split())
    vm.guest.run(["mount", "/tmp/pers"]).check()  # by the fstab entry
    done = json.loads(raid(vm, "destroy", "pers", "--yes").stdout)
    assert [s["kind"] for s in done["plan"]] == ["umount", "unfstab", "unconf", "stop", "zero"]
    assert conf["line"] not in vm.guest.run(["cat", conf["path"]]).check().stdout
    assert fstab["line"] not in vm.guest.run(["cat", "/etc/fstab"]).check().stdout
    free(vm, "IOT6", "IOT7", "IOT8")
