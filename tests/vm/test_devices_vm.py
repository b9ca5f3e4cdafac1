"""`iotune devices` inside a QEMU guest with emulated NVMe drives and a real md array."""

from __future__ import annotations

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
