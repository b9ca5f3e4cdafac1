"""What a raid create is asked for and what it finds: layout files and their keys, flags over a
layout, when an existing array already is the one asked for, choosing the members, the md
driver for a level, and drive names resolved through the Host (a recorded or a made-up tree)."""

from pathlib import Path
from typing import Any

import pytest

from iotune import proc
from iotune.errors import DeviceNotFound, IotuneError, UsageError
from iotune.probes.blockdev import find_block_devices
from iotune.probes.host import RecordedHost
from iotune.probes.sysfs import SysTree
from iotune.raid import apply as raid_apply
from iotune.raid.model import MD_DRIVERS, ArrayInfo, Fs, RaidRequest
from iotune.raid.plan import existing_members, matches_existing, pick_members
from iotune.raid.request import CreateFlags, load_layout, merge, request_from

DATA = Path(__file__).resolve().parent.parent / "data"
TOP = Path(__file__).resolve().parents[2]
K = 1024


def flags(**kw: Any) -> CreateFlags:
    """The create command's defaults, with *kw* as typed on the command line."""
    values: dict[str, Any] = {
        "devices": (),
        "all_unused": False,
        "level": 0,
        "chunk": "512K",
        "name": "offload",
        "fs": "xfs",
        "mount": None,
        "persist": False,
        "wipe": False,
        "mkfs_options": (),
    }
    values.update(kw)
    return CreateFlags(**values, given=frozenset(kw))


def test_layout_files_of_the_repository_load() -> None:
    layout = load_layout(str(TOP / "raid/checkpoint-raid6.toml"))
    assert layout == {
        "name": "checkpoint",
        "level": 6,
        "chunk": "256K",
        "fs": "xfs",
        "mount": "/mnt/checkpoint",
        "persist": True,
        "all_unused": True,
    }


def test_layout_errors_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        load_layout(str(tmp_path / "none.toml"))
    (tmp_path / "bad.toml").write_text("level = \n")
    with pytest.raises(UsageError, match="is not valid TOML"):
        load_layout(str(tmp_path / "bad.toml"))
    (tmp_path / "typo.toml").write_text('name = "x"\nlevle = 0\nmnt = "/m"\n')
    with pytest.raises(UsageError, match=r"unknown key\(s\) levle, mnt") as info:
        load_layout(str(tmp_path / "typo.toml"))
    assert info.value.hint == (
        "keys: all_unused, chunk, devices, fs, level, mount, name, persist, wipe"
    )


def test_flags_typed_win_over_the_layout_and_the_layout_over_defaults() -> None:
    layout = {"name": "ckpt", "level": 6, "chunk": "256K", "mount": "/mnt/c", "persist": True}
    spec = merge(layout, flags(chunk="1M", mount="/mnt/x"))
    assert (spec["name"], spec["level"], spec["chunk"], spec["mount"]) == (
        "ckpt",
        6,
        "1M",
        "/mnt/x",
    )
    assert spec["fs"] == "xfs"  # not in the layout: the flag's default
    assert spec["persist"] is True and spec["wipe"] is False  # a layout's true stays on
    assert merge({}, flags(wipe=True))["wipe"] is True


def test_named_drives_replace_the_layouts_all_unused() -> None:
    layout = {"all_unused": True, "devices": ["nvme9n1"]}
    spec = merge(layout, flags(devices=("nvme0n1", "nvme1n1")))
    assert (spec["devices"], spec["all_unused"]) == (["nvme0n1", "nvme1n1"], False)
    assert merge({"devices": ["nvme9n1"]}, flags(all_unused=True))["all_unused"] is True


def test_request_from_a_layout_and_flags() -> None:
    req = request_from(
        load_layout(str(TOP / "raid/offload-raid0.toml")),
        flags(level=10, chunk="64K", mkfs_options=("-K",)),
    )
    assert req == RaidRequest(
        name="offload",
        level=10,
        chunk=64 * K,
        all_unused=True,
        fs=Fs.XFS,
        mount="/mnt/offload",
        mkfs_options=("-K",),
    )


def test_request_value_errors() -> None:
    with pytest.raises(UsageError, match="bad layout value: 'zfs' is not a valid Fs"):
        request_from({"fs": "zfs", "all_unused": True}, flags())
    with pytest.raises(UsageError, match="chunk 'big' is not a size"):
        request_from({}, flags(chunk="big", all_unused=True))
    with pytest.raises(UsageError, match="name the drives, or --all-unused"):
        request_from({}, flags())


def array(
    level: str = "raid0", chunk: int | None = 512 * K, members: tuple[str, ...] = ()
) -> ArrayInfo:
    return ArrayInfo(
        name="offload",
        device="/dev/md/offload",
        kernel_name="md127",
        level=level,
        chunk_bytes=chunk,
        state="clean",
        size_bytes=3 * 2**30,
        members=[{"device": f"/dev/{m}", "model": None, "serial": None} for m in members]
        + [{"device": None, "model": None, "serial": None}],
        fs="xfs",
        fs_uuid=None,
        mountpoints=[],
        max_sectors_kb=None,
        minimum_io_size=None,
        optimal_io_size=None,
        sync_action=None,
        sync_completed=None,
    )


def test_an_existing_array_matches_on_level_chunk_and_named_members() -> None:
    info = array(members=("nvme4n1", "nvme0n1"))
    assert existing_members(info) == ["nvme0n1", "nvme4n1"]
    req = RaidRequest(name="offload", level=0, chunk=512 * K, all_unused=True)
    assert matches_existing(info, req, None)
    assert matches_existing(info, req, ["nvme4n1", "nvme0n1"])
    assert not matches_existing(info, req, ["nvme0n1", "nvme5n1"])
    assert not matches_existing(info, RaidRequest(name="offload", chunk=256 * K), None)
    assert not matches_existing(info, RaidRequest(name="offload", level=10), None)
    # RAID1 has no chunk to compare
    assert matches_existing(array("raid1", None), RaidRequest(name="m", level=1), None)


def test_members_are_the_free_nvme_drives_or_the_named_ones_in_order() -> None:
    disks = find_block_devices(RecordedHost(DATA / "qemu-nvme"))
    every = RaidRequest(name="offload", all_unused=True)
    assert [d.name for d in pick_members(disks, every, [])] == ["nvme0n1", "nvme4n1", "nvme5n1"]
    named = RaidRequest(name="offload", devices=("x", "y"))
    assert [d.name for d in pick_members(disks, named, ["nvme5n1", "nvme1n1"])] == [
        "nvme5n1",
        "nvme1n1",
    ]
    with pytest.raises(DeviceNotFound, match="no block device 'nvme9n1'"):
        pick_members(disks, named, ["nvme0n1", "nvme9n1"])
    busy = [d for d in disks if d.in_use]
    with pytest.raises(UsageError, match="no free NVMe drives"):
        pick_members(busy, every, [])


def test_md_driver_per_level() -> None:
    assert MD_DRIVERS[0] == ("raid0", "raid0")
    assert MD_DRIVERS[5] == ("raid456", "raid5") and MD_DRIVERS[6] == ("raid456", "raid6")
    assert MD_DRIVERS[10] == ("raid10", "raid10")


def test_ensure_md_loads_the_module_and_checks_mdstat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[list[str]] = []
    monkeypatch.setattr(proc, "run", lambda argv, **kw: ran.append(list(argv)))
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/mdstat").write_text("Personalities : [raid0] [raid6] [raid5] [raid4]\n")
    tree = SysTree(tmp_path)
    raid_apply.ensure_md(6, tree)
    assert ran == [["modprobe", "raid456"]]
    with pytest.raises(IotuneError, match="the running kernel has no md raid10 driver"):
        raid_apply.ensure_md(10, tree)
    assert ran[-1] == ["modprobe", "raid10"]


def test_drive_names_resolve_through_the_recorded_host() -> None:
    host = RecordedHost(DATA / "qemu-nvme")
    assert host.disk_name("nvme0n1") == "nvme0n1"
    assert host.disk_name("/dev/nvme4n1") == "nvme4n1"
    with pytest.raises(DeviceNotFound, match="no block device '/dev/nvme9n1'"):
        host.disk_name("/dev/nvme9n1")


def test_links_and_partitions_resolve_through_the_tree(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/nvme0n1/nvme0n1p1").mkdir(parents=True)
    (tmp_path / "sys/devices/nvme0n1/nvme0n1p1/partition").write_text("1\n")
    (tmp_path / "sys/block").mkdir(parents=True)
    (tmp_path / "sys/block/nvme0n1").symlink_to("../devices/nvme0n1")
    (tmp_path / "sys/class/block").mkdir(parents=True)
    (tmp_path / "sys/class/block/nvme0n1p1").symlink_to("../../devices/nvme0n1/nvme0n1p1")
    (tmp_path / "dev/disk/by-id").mkdir(parents=True)
    (tmp_path / "dev/disk/by-id/nvme-IOT0").symlink_to("../../nvme0n1")
    host = RecordedHost(tmp_path)
    assert host.disk_name("/dev/disk/by-id/nvme-IOT0") == "nvme0n1"
    with pytest.raises(UsageError, match="/dev/nvme0n1p1 is a partition") as info:
        host.disk_name("/dev/nvme0n1p1")
    assert info.value.hint == "ask for its disk: iotune devices /dev/nvme0n1"
