"""`iotune raid create` and `destroy` over a recorded guest: plan output, JSON schema,
confirmation, and exactly one JSON document on stdout."""

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune.cli import raid as raid_cli
from iotune.probes.host import RecordedHost
from iotune.raid import apply as raid_apply
from iotune.raid import host as raid_host
from iotune.raid.model import ArrayInfo, HostSetup
from iotune.raid.plan import ArrayFacts, plan_destroy

DATA = Path(__file__).resolve().parent.parent / "data"
TOP = Path(__file__).resolve().parents[2]
NAMES = ("nvme0n1", "nvme4n1", "nvme5n1")  # the blank drives of the recorded guest


@pytest.fixture
def guest(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
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


def built(monkeypatch: pytest.MonkeyPatch) -> None:
    """After apply: no modprobe, and the array as the kernel would describe it."""
    monkeypatch.setattr(raid_apply, "ensure_md", lambda level, tree: None)
    monkeypatch.setattr(raid_host, "array_info", lambda host, md: ARRAY)


ARRAY = ArrayInfo(
    name="offload",
    device="/dev/md/offload",
    kernel_name="md127",
    level="raid0",
    chunk_bytes=512 * 1024,
    state="clean",
    size_bytes=3 * 2**27,
    members=[{"device": f"/dev/{n}", "model": "QEMU NVMe Ctrl", "serial": None} for n in NAMES],
    fs="xfs",
    fs_uuid=None,
    mountpoints=[],
    max_sectors_kb=512,
    minimum_io_size=524288,
    optimal_io_size=1572864,
    sync_action=None,
    sync_completed=None,
)


def test_json_create_declined_prints_the_plan_on_stderr_and_nothing_on_stdout(
    guest: list[Any],
) -> None:
    r = invoke("--json", "raid", "create", "--all-unused", input="n\n")
    assert r.exit_code == 1
    assert r.stdout == ""
    assert "Plan: RAID0 /dev/md/offload over 3 drives" in r.stderr
    assert "Build /dev/md/offload? [y/N]" in r.stderr
    assert r.stderr.strip().splitlines()[-2:] == [
        "iotune: error: not confirmed: nothing was changed",
        "hint: --yes applies without asking",
    ]
    assert guest == []


def test_json_create_confirmed_prints_one_document(
    guest: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    built(monkeypatch)
    r = invoke("--json", "raid", "create", "--all-unused", input="y\n")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)  # exactly one document: a second one would not parse
    assert doc["applied"] is True and doc["array"]["kernel_name"] == "md127"
    assert doc["plan"]["members"] == ["/dev/nvme0n1", "/dev/nvme4n1", "/dev/nvme5n1"]
    assert len(guest) == 1


def test_json_create_with_yes_prints_one_document_and_no_plan_text(
    guest: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    built(monkeypatch)
    r = invoke("--json", "raid", "create", "--all-unused", "--yes")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["applied"] is True
    assert "Plan:" not in r.stderr and len(guest) == 1


def test_an_array_already_there_as_asked_changes_nothing(
    guest: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(raid_host, "find_array", lambda host, name: "md127")
    monkeypatch.setattr(raid_host, "array_info", lambda host, md: ARRAY)
    r = invoke("--json", "raid", "create", *NAMES)
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["changed"] is False
    r = invoke("raid", "create", "/dev/nvme0n1", "nvme4n1", "nvme5n1", "--yes")
    assert r.exit_code == 0, r.stderr
    assert "/dev/md/offload already exists as asked (raid0, nvme0n1, nvme4n1, nvme5n1)" in r.stdout
    r = invoke("raid", "create", "nvme0n1", "nvme4n1", "--yes")
    assert r.exit_code == 2
    assert (
        "an array named 'offload' already exists (raid0, members nvme0n1, nvme4n1, nvme5n1)"
        in r.stderr
    )
    assert guest == []


def destroy_plan(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    facts = ArrayFacts(
        name="offload",
        device="/dev/md/offload",
        kernel_name="md127",
        members=tuple(f"/dev/{n}" for n in NAMES),
        mountpoints=("/mnt/offload",),
        holders=(),
        open_by=(),
        swap=False,
        conf_lines=(),
        fstab_lines=(),
    )
    steps = plan_destroy(facts, wipe_members=False, setup=HostSetup(initramfs=None))
    monkeypatch.setattr(
        raid_host, "prepare_destroy", lambda host, name, wipe_members: (facts, steps)
    )
    applied: list[Any] = []
    monkeypatch.setattr(raid_apply, "apply_steps", lambda *a, **k: applied.append(a))
    return applied


def test_json_destroy_declined_prints_nothing_on_stdout(
    guest: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    applied = destroy_plan(monkeypatch)
    r = invoke("--json", "raid", "destroy", "offload", input="n\n")
    assert r.exit_code == 1
    assert r.stdout == ""
    assert "Plan: destroy /dev/md/offload (md127, members /dev/nvme0n1" in r.stderr
    assert "1. umount /mnt/offload" in r.stderr
    assert "Destroy /dev/md/offload? [y/N]" in r.stderr
    assert "iotune: error: not confirmed: nothing was changed" in r.stderr
    assert applied == []


def test_json_destroy_confirmed_prints_one_document(
    guest: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    applied = destroy_plan(monkeypatch)
    r = invoke("--json", "raid", "destroy", "offload", input="y\n")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["applied"] is True
    assert [s["kind"] for s in doc["plan"]] == ["umount", "stop", "zero"]
    assert len(applied) == 1
    r = invoke("--json", "raid", "destroy", "offload", "--dry-run")
    assert json.loads(r.stdout)["applied"] is False and len(applied) == 1
