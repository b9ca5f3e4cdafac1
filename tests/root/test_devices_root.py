"""`iotune devices` and `iotune doctor` on the real host: real loop devices, real mounts,
real wipefs and O_EXCL probes, real bcc."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.root.conftest import iotune, iotune_json

pytestmark = pytest.mark.beside_study


def by_name(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [d for d in doc["devices"] if d["name"] == name]
    assert found, f"{name} not listed: {[d['name'] for d in doc['devices']]}"
    return found[0]


def test_loop_device_listed_with_size_and_queue_limits(loop_device: Callable[..., str]) -> None:
    dev = loop_device(size_mib=48, sector_size=4096)
    name = Path(dev).name
    Path(f"/sys/block/{name}/queue/max_sectors_kb").write_text("128")
    hw = int(Path(f"/sys/block/{name}/queue/max_hw_sectors_kb").read_text())
    d = by_name(iotune_json("devices", "--all"), name)
    assert d["transport"] == "loop"
    assert d["size_bytes"] == 48 * 2**20
    assert (d["logical_block_size"], d["physical_block_size"]) == (4096, 4096)
    assert d["queue"]["max_sectors_kb"] == 128
    assert d["queue"]["max_hw_sectors_kb"] == hw
    assert d["backing_file"].endswith("disk0.img")
    assert d["in_use"] == []


def test_default_listing_is_nvme_only(loop_device: Callable[..., str]) -> None:
    name = Path(loop_device()).name
    doc = iotune_json("devices")
    assert all(d["transport"] == "nvme" for d in doc["devices"])
    assert name not in [d["name"] for d in doc["devices"]]


def test_mounted_loop_device_is_in_use_with_its_mount_point(
    loop_device: Callable[..., str],
) -> None:
    dev = loop_device(fs="ext4", mount=True)
    mnt = loop_device.mounts[0]  # type: ignore[attr-defined]
    d = by_name(iotune_json("devices", dev), Path(dev).name)
    reasons = {r["kind"]: r["detail"] for r in d["in_use"]}
    assert reasons["mounted"] == f"{Path(dev).name} is mounted at {mnt} (ext4)"
    assert reasons["signature"].startswith("ext4 signature on")
    assert "Device or resource busy" in reasons["busy"]
    table = iotune("devices", dev).stdout
    assert "in use: mounted, signature, busy" in table
    assert f"is mounted at {mnt}" in table


def test_unmounted_filesystem_is_still_in_use(loop_device: Callable[..., str]) -> None:
    dev = loop_device(size_mib=320, fs="xfs")  # mkfs.xfs wants 300 MB or more
    d = by_name(iotune_json("devices", dev), Path(dev).name)
    assert [r["kind"] for r in d["in_use"]] == ["signature"]
    assert d["signatures"][0]["type"] == "xfs"


def test_missing_device_path_is_one_line_usage_error() -> None:
    p = iotune("devices", "/dev/iotune-nope", check=False)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [
        "iotune: error: no block device '/dev/iotune-nope'",
        "hint: 'iotune devices --all' lists every disk this host has",
    ]


def test_not_root_is_one_line_error() -> None:
    # a real process that drops to uid/gid 65534 after start-up (the interpreter lives
    # under /root, which the nobody user cannot read: the command's module, which iotune
    # imports when the command is asked for, is imported before)
    code = (
        "import os, sys\n"
        "from iotune.cli import main\n"
        "import iotune.cli.devices\n"
        "os.setgroups([]); os.setegid(65534); os.seteuid(65534)\n"
        "sys.argv = ['iotune', 'devices']\n"
        "main()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert p.returncode == 1
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert lines[0] == "iotune: error: iotune devices needs root"
    assert lines[1].startswith("hint: run it as root")
    assert len(lines) == 2


def test_doctor_loads_a_real_bpf_program() -> None:
    doc = iotune_json("doctor")
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["root"]["status"] == "PASS"
    assert checks["tracefs"]["status"] == "PASS"
    assert checks["BPF load"]["status"] == "PASS", checks["BPF load"]
    assert "attached probe.bpf.c (1 tracepoint)" in checks["BPF load"]["found"]
    assert checks["fio"]["status"] == "PASS"
    assert checks["mdadm"]["status"] == "PASS"
    assert checks["DeepSpeed"]["status"] == "PASS"
    assert doc["ready"]["trace"] is True
    # nothing attached is left behind
    assert iotune("doctor", "--for", "trace").returncode == 0


def test_doctor_exit_code_follows_the_family(tmp_path: Path) -> None:
    doc = iotune_json("doctor")
    for family, ok in doc["ready"].items():
        p = iotune("doctor", "--for", family, check=False)
        assert p.returncode == (0 if ok else 1), (family, p.stderr)
        if not ok:
            assert f"not ready for '{family}'" in p.stderr
