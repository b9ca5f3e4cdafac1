"""`iotune raid create` CLI over a recorded guest: plan output, JSON schema, confirmation."""

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune.cli import raid as raid_cli
from iotune.probes.host import RecordedHost
from iotune.raid import apply as raid_apply
from iotune.raid import host as raid_host
from iotune.raid.model import HostSetup

DATA = Path(__file__).resolve().parent.parent / "data"
TOP = Path(__file__).resolve().parents[2]


@pytest.fixture
def guest(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setattr(raid_cli.os, "geteuid", lambda: 0)
    monkeypatch.setattr(raid_cli, "LiveHost", lambda: RecordedHost(DATA / "qemu-nvme"))
    monkeypatch.setattr(raid_host, "find_array", lambda host, name: None)
    monkeypatch.setattr(
        raid_host,
        "host_setup",
        lambda: HostSetup(initramfs=None, initramfs_note="no initramfs tool"),
    )
    applied: list[Any] = []
    monkeypatch.setattr(raid_apply, "apply_create", lambda *a, **k: applied.append(a))
    return applied


def invoke(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(cli_mod.cli, list(args), input=input, prog_name="iotune")


def test_dry_run_prints_the_plan_and_changes_nothing(guest: list[Any]) -> None:
    r = invoke("raid", "create", "--all-unused", "--mount", "/mnt/offload", "--dry-run")
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert "Plan: RAID0 /dev/md/offload over 3 drives" in out
    assert "member /dev/nvme0n1 (QEMU NVMe Ctrl, IOT0, 128.0 MiB)" in out
    assert "mdadm --create /dev/md/offload --level=0 --raid-devices=3 --chunk=512K" in out
    assert "mkfs.xfs -L offload" in out and "-d su=512k,sw=3 /dev/md/offload" in out
    assert "mount -o noatime /dev/md/offload /mnt/offload" in out
    assert out.count("why: ") == 5
    assert guest == []


def test_json_plan_schema(guest: list[Any]) -> None:
    r = invoke(
        "--json", "raid", "create", "--all-unused", "--level", "5", "--chunk", "64K", "--dry-run"
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    plan = doc["plan"]
    assert doc["applied"] is False
    assert plan["device"] == "/dev/md/offload"
    assert plan["members"] == ["/dev/nvme0n1", "/dev/nvme4n1", "/dev/nvme5n1"]
    assert plan["data_disks"] == 2 and plan["alignment"] == "su=64k,sw=2"
    assert plan["request"]["level"] == 5 and plan["request"]["chunk"] == 65536
    assert {"kind", "why", "argv", "path", "line"} <= set(plan["steps"][0])
    assert plan["steps"][0]["argv"][:2] == ["mdadm", "--create"]


def test_confirmation_refused_on_eof_changes_nothing(guest: list[Any]) -> None:
    r = invoke("raid", "create", "--all-unused", input="")
    assert r.exit_code == 1
    assert "Build /dev/md/offload? [y/N]" in r.stderr
    assert "iotune: error: not confirmed: nothing was changed" in r.stderr
    assert guest == []


def test_confirmation_no_changes_nothing(guest: list[Any]) -> None:
    r = invoke("raid", "create", "--all-unused", input="n\n")
    assert r.exit_code == 1 and guest == []


def test_layout_file_and_flag_override(guest: list[Any]) -> None:
    r = invoke(
        "--json",
        "raid",
        "create",
        "--layout",
        str(TOP / "raid/offload-raid0.toml"),
        "--chunk",
        "256K",
        "--dry-run",
    )
    assert r.exit_code == 0, r.stderr
    req = json.loads(r.stdout)["plan"]["request"]
    assert (req["name"], req["level"], req["chunk"], req["fs"], req["mount"]) == (
        "offload",
        0,
        256 * 1024,
        "xfs",
        "/mnt/offload",
    )
    assert req["all_unused"] is True


def test_raid6_layout_needs_four_drives(guest: list[Any]) -> None:
    r = invoke("raid", "create", "--layout", str(TOP / "raid/checkpoint-raid6.toml"), "--dry-run")
    assert r.exit_code == 1
    assert "RAID6 needs at least 4 drives, got 3" in r.stderr


def test_bad_layout_key(guest: list[Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\nlevle = 0\n')
    r = invoke("raid", "create", "--layout", str(bad), "--dry-run")
    assert r.exit_code == 2
    assert "unknown key(s) levle" in r.stderr


def test_needs_devices_or_all_unused(guest: list[Any]) -> None:
    r = invoke("raid", "create", "--dry-run")
    assert r.exit_code == 2 and "name the drives, or --all-unused" in r.stderr


def test_bad_chunk_is_a_usage_error(guest: list[Any]) -> None:
    r = invoke("raid", "create", "--all-unused", "--chunk", "big", "--dry-run")
    assert r.exit_code == 2 and "chunk 'big' is not a size" in r.stderr
