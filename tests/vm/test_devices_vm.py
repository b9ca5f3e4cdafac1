"""`iotune devices` inside a QEMU guest with emulated NVMe drives and a real md array."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.vm.conftest import BLANK, DRIVES, Session

pytestmark = pytest.mark.beside_study


@pytest.fixture(scope="module")
def listing(vm: Session) -> dict[str, Any]:
    doc = vm.iotune_json("devices")
    return {d["serial"]: d for d in doc["devices"]}


def kinds(d: dict[str, Any]) -> set[str]:
    return {r["kind"] for r in d["in_use"]}


def test_lists_exactly_the_emulated_nvme_drives(listing: dict[str, Any], vm: Session) -> None:
    assert sorted(listing) == sorted(d.serial for d in DRIVES)
    sizes = {d.serial: d.size_mib for d in DRIVES}
    for serial, d in listing.items():
        assert d["transport"] == "nvme"
        assert d["model"] == "QEMU NVMe Ctrl"
        assert d["size_bytes"] == sizes[serial] * 2**20
        assert d["path"] == vm.dev(serial)
        assert d["firmware"]
        assert d["queue"]["max_sectors_kb"] > 0


def test_blank_drives_are_free(listing: dict[str, Any]) -> None:
    for serial in BLANK:
        assert listing[serial]["in_use"] == [], listing[serial]["in_use"]


def test_preformatted_drive_is_in_use_for_its_signature(listing: dict[str, Any]) -> None:
    d = listing["IOT1"]
    assert kinds(d) == {"signature"}
    assert [s["type"] for s in d["signatures"]] == ["ext4"]
    assert d["signatures"][0]["label"] == "iot1"


def test_md_member_is_in_use_with_its_array(listing: dict[str, Any]) -> None:
    d = listing["IOT2"]
    assert kinds(d) == {"signature", "holders", "busy"}
    assert d["holders"] == ["md127"]
    assert [s["type"] for s in d["signatures"]] == ["linux_raid_member"]
    details = [r["detail"] for r in d["in_use"]]
    assert "held by md127" in details


def test_mounted_drive_names_its_mount_point(listing: dict[str, Any], vm: Session) -> None:
    d = listing["IOT3"]
    assert kinds(d) == {"mounted", "signature", "busy"}
    name = vm.dev("IOT3").removeprefix("/dev/")
    assert f"{name} is mounted at /tmp/iot3 (ext4)" in [r["detail"] for r in d["in_use"]]


def test_all_adds_the_md_array_with_its_member(vm: Session) -> None:
    doc = vm.iotune_json("devices", "--all")
    md = [d for d in doc["devices"] if d["transport"] == "md"]
    assert len(md) == 1
    assert md[0]["slaves"] == [vm.dev("IOT2").removeprefix("/dev/")]
    assert md[0]["model"] == "Linux md raid1"


def test_each_drive_shows_its_health_log_and_it_counts_what_was_written(vm: Session) -> None:
    """The NVMe health log through the admin passthrough ioctl, from QEMU's controllers: 16
    MiB written with O_DIRECT to a blank drive (past its first megabytes: no signature) show
    in its data units written (512,000 bytes each, rounded up by the drive)."""
    name = vm.dev("IOT0").removeprefix("/dev/")
    before = vm.iotune_json("devices")["health"]
    assert sorted(before) == sorted(vm.dev(d.serial).removeprefix("/dev/") for d in DRIVES)
    h0 = before[name]
    assert h0["percentage_used"] == 0  # QEMU reports no wear (and 0% spare)
    assert h0["media_errors"] == 0 and h0["life_writes_bytes"] is None
    dd = ["dd", "if=/dev/zero", f"of={vm.dev('IOT0')}", "bs=1M", "count=16", "seek=64"]
    vm.guest.run([*dd, "oflag=direct", "status=none"]).check()
    h1 = vm.iotune_json("devices")["health"][name]
    grew = h1["data_written_bytes"] - h0["data_written_bytes"]
    assert abs(grew - 16 * 2**20) <= 512_000, grew
    assert vm.iotune_json("devices", vm.dev("IOT0"))["devices"][0]["in_use"] == []


def test_the_guests_clock_is_the_hosts_tsc_where_the_hosts_is(vm: Session) -> None:
    """The guest's kernel reads time from the TSC where the host does (tests/vm/guest.py
    clock_options: each HPET read is an emulated register), and its clock keeps the host's
    pace: ten seconds of the host's are ten of the guest's."""
    host = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    code = (
        "import time; print(open('/sys/devices/system/clocksource/clocksource0/"
        "current_clocksource').read().strip(), time.monotonic())"
    )
    ta = time.monotonic()
    r = vm.guest.run([sys.executable, "-c", code]).check()
    t0 = time.monotonic()
    mine, g0 = r.stdout.split()
    want = "tsc" if host.read_text().strip() == "tsc" else mine
    assert mine == want, (mine, host.read_text())
    time.sleep(10)
    t1 = time.monotonic()
    g1 = float(vm.guest.run([sys.executable, "-c", code]).check().stdout.split()[1])
    t2 = time.monotonic()
    # the guest read its clock between ta and t0, then between t1 and t2 (the host's): its
    # interval lies within those, give or take 2% of rate (the TSC's calibration at boot)
    dg = g1 - float(g0)
    assert 0.98 * (t1 - t0) <= dg <= 1.02 * (t2 - ta), (dg, t1 - t0, t2 - ta)
