"""The raid planner's safety rules, one test per rule, over probe records recorded from a
QEMU guest (tests/data/qemu-nvme: IOT0/4/5 blank, IOT1 ext4, IOT2 in md127, IOT3 mounted)
and from the CI host (tests/data/ci-host: loop3 partitioned, vda the root disk)."""

from dataclasses import replace
from pathlib import Path

import pytest

from iotune.probes.blockdev import BlockDevice, Use, UseReason, find_block_devices
from iotune.probes.host import RecordedHost
from iotune.raid.model import Fs, HostSetup, RaidRequest
from iotune.raid.plan import (
    ArrayFacts,
    Refused,
    Uuids,
    capacity,
    choose_unused,
    plan_create,
    plan_destroy,
)

DATA = Path(__file__).resolve().parent.parent / "data"
UUIDS = Uuids(
    array="01234567:89abcdef:01234567:89abcdef", fs="0b0e2f52-5a2b-4c8e-9a55-3c1c0d9e7a11"
)
SETUP = HostSetup(
    mdadm_conf="/etc/mdadm/mdadm.conf", fstab="/etc/fstab", initramfs=("update-initramfs", "-u")
)
MIB = 2**20


def nvme() -> dict[str, BlockDevice]:
    devs = find_block_devices(RecordedHost(DATA / "qemu-nvme"))
    return {d.serial: d for d in devs if d.serial}


def host() -> dict[str, BlockDevice]:
    return {d.name: d for d in find_block_devices(RecordedHost(DATA / "ci-host"))}


def refusal(disks: list[BlockDevice], **kw: object) -> list[str]:
    req = RaidRequest(name=str(kw.pop("name", "offload")), **kw)  # type: ignore[arg-type]
    with pytest.raises(Refused) as info:
        plan_create(disks, req, SETUP, UUIDS)
    return info.value.reasons


def blank() -> list[BlockDevice]:
    n = nvme()
    return [n["IOT0"], n["IOT4"], n["IOT5"]]


def test_mounted_drive_is_refused_even_with_wipe() -> None:
    n = nvme()
    for wipe in (False, True):
        reasons = refusal([*blank()[:2], n["IOT3"]], wipe=wipe)
        assert "/dev/nvme3n1: nvme3n1 is mounted at /tmp/iot3 (ext4)" in reasons


def test_filesystem_signature_is_refused_without_wipe() -> None:
    reasons = refusal([*blank()[:2], nvme()["IOT1"]])
    assert reasons == [
        "/dev/nvme1n1: ext4 signature on nvme1n1 at offset 0x438 (--wipe erases signatures)"
    ]


def test_wipe_clears_a_signature_and_the_plan_lists_it() -> None:
    disks = [*blank()[:2], nvme()["IOT1"]]
    plan = plan_create(disks, RaidRequest(name="offload", wipe=True), SETUP, UUIDS)
    assert plan.steps[0].argv == ("wipefs", "--all", "/dev/nvme1n1")
    assert "ext4 at 0x438" in plan.steps[0].why
    assert plan.wipes == ("/dev/nvme1n1",)
    assert [s.kind for s in plan.steps].count("wipe") == 1


def test_md_member_with_holders_is_refused_even_with_wipe() -> None:
    reasons = refusal([*blank()[:2], nvme()["IOT2"]], wipe=True)
    assert "/dev/nvme2n1: held by md127" in reasons
    assert any(r.startswith("/dev/nvme2n1: cannot be opened exclusively") for r in reasons)
    assert not any("linux_raid_member" in r for r in reasons)  # wiped, but the rest still blocks


def test_partitioned_disk_is_refused() -> None:
    reasons = refusal([host()["loop3"], host()["loop0"]], wipe=True)
    assert "/dev/loop3: has partitions: loop3p1" in reasons


def test_root_disk_is_refused() -> None:
    reasons = refusal([host()["vda"], host()["loop0"]], wipe=True)
    assert "/dev/vda: backs the / filesystem" in reasons
    assert "/dev/vda: vda is mounted at / (ext4)" in reasons


def test_swap_is_refused() -> None:
    swap = replace(blank()[0], in_use=(UseReason(Use.SWAP, "/dev/nvme0n1 is active swap"),))
    assert refusal([swap, *blank()[1:]], wipe=True) == ["/dev/nvme0n1: /dev/nvme0n1 is active swap"]


def test_a_namespace_without_a_live_path_is_refused_even_with_wipe() -> None:
    detail = "no live path to nvme-tcp 10.0.0.2:4420 (nvme3 connecting)"
    down = replace(blank()[0], in_use=(UseReason(Use.NOT_LIVE, detail),))
    assert refusal([down, *blank()[1:]], wipe=True) == [f"/dev/nvme0n1: {detail}"]


def test_exclusive_open_failure_alone_is_refused() -> None:
    busy = replace(
        blank()[0],
        in_use=(
            UseReason(Use.BUSY, "cannot be opened exclusively (O_EXCL): Device or resource busy"),
        ),
    )
    assert refusal([busy, *blank()[1:]]) == [
        "/dev/nvme0n1: cannot be opened exclusively (O_EXCL): Device or resource busy"
    ]


def test_an_md_array_is_not_a_drive() -> None:
    md = {d.name: d for d in find_block_devices(RecordedHost(DATA / "qemu-nvme"))}["md127"]
    reasons = refusal([md, *blank()[:2]])
    assert "/dev/md127 is itself a md device, not a drive" in reasons


def test_tiny_drive_is_refused() -> None:
    tiny = replace(blank()[0], size_bytes=MIB)
    reasons = refusal([tiny, *blank()[1:]])
    assert reasons == ["/dev/nvme0n1 (1M) is smaller than 1% of the others' size"]


def test_minimum_drive_count_per_level() -> None:
    assert refusal(blank(), level=6) == ["RAID6 needs at least 4 drives, got 3"]
    assert refusal(blank()[:1], level=0) == ["RAID0 needs at least 2 drives, got 1"]


def test_request_values_are_checked() -> None:
    assert refusal(blank(), chunk=3000) == [
        "chunk 3000 bytes: must be a power of two of at least 4K"
    ]
    assert "name 'bad name!'" in refusal(blank(), name="bad name!")[0]
    assert refusal(blank(), mount="relative") == [
        "mount point 'relative': must be an absolute path other than /"
    ]
    assert refusal(blank(), fs=Fs.NONE, mount="/mnt/x") == [
        "--mount needs a filesystem (--fs xfs or ext4)"
    ]
    # RAID1 has no chunk: any --chunk value is ignored
    plan_create(blank()[:2], RaidRequest(name="m", level=1, chunk=3000), SETUP, UUIDS)


def test_mount_point_in_use_is_refused() -> None:
    req = RaidRequest(name="offload", mount="/mnt/offload/")
    with pytest.raises(Refused, match="already a mount point"):
        plan_create(blank(), req, SETUP, UUIDS, mounted_paths=["/mnt/offload"])


def test_raid0_plan_commands_alignment_and_persistence() -> None:
    req = RaidRequest(name="offload", chunk=512 * 1024, mount="/mnt/offload", persist=True)
    plan = plan_create(blank(), req, SETUP, UUIDS)
    by_kind = {s.kind: s for s in plan.steps}
    assert by_kind["create"].argv == (
        "mdadm",
        "--create",
        "/dev/md/offload",
        "--level=0",
        "--raid-devices=3",
        "--chunk=512K",
        "--metadata=1.2",
        "--homehost=any",
        "--name=offload",
        f"--uuid={UUIDS.array}",
        "--run",
        "/dev/nvme0n1",
        "/dev/nvme4n1",
        "/dev/nvme5n1",
    )
    assert by_kind["mkfs"].argv == (
        "mkfs.xfs",
        "-L",
        "offload",
        "-m",
        f"uuid={UUIDS.fs}",
        "-d",
        "su=512k,sw=3",
        "/dev/md/offload",
    )
    assert by_kind["mount"].argv == ("mount", "-o", "noatime", "/dev/md/offload", "/mnt/offload")
    assert (
        by_kind["conf"].line
        == f"ARRAY /dev/md/offload metadata=1.2 UUID={UUIDS.array} name=any:offload"
    )
    assert by_kind["fstab"].line == f"UUID={UUIDS.fs} /mnt/offload xfs noatime,nofail 0 0"
    assert by_kind["initramfs"].argv == ("update-initramfs", "-u")
    assert [s.kind for s in plan.steps] == [
        "create",
        "wait",
        "mkfs",
        "mkdir",
        "mount",
        "conf",
        "initramfs",
        "fstab",
    ]
    assert plan.data_disks == 3 and plan.alignment == "su=512k,sw=3"
    assert plan.capacity_bytes == capacity(0, [128 * MIB] * 3) == 3 * 127 * MIB
    assert all(s.why for s in plan.steps)


def test_raid6_ext4_plan() -> None:
    n = nvme()
    disks = [*blank(), replace(n["IOT0"], name="nvme9n1", path="/dev/nvme9n1")]
    plan = plan_create(
        disks, RaidRequest(name="ckpt", level=6, chunk=256 * 1024, fs=Fs.EXT4), SETUP, UUIDS
    )
    mkfs = next(s for s in plan.steps if s.kind == "mkfs")
    assert mkfs.argv == (
        "mkfs.ext4",
        "-q",
        "-L",
        "ckpt",
        "-U",
        UUIDS.fs,
        "-E",
        "stride=64,stripe_width=128",
        "/dev/md/ckpt",
    )
    assert plan.data_disks == 2
    assert any("resync" in note for note in plan.notes)


def test_no_initramfs_tool_becomes_a_note() -> None:
    setup = HostSetup(
        initramfs=None, initramfs_note="/boot is not writable: the initramfs was left as it is"
    )
    plan = plan_create(blank(), RaidRequest(name="o", mount="/mnt/o", persist=True), setup, UUIDS)
    assert "initramfs" not in [s.kind for s in plan.steps]
    assert setup.initramfs_note in plan.notes


def test_all_unused_picks_free_nvme_drives_only() -> None:
    chosen = choose_unused(list(find_block_devices(RecordedHost(DATA / "qemu-nvme"))))
    assert [d.serial for d in chosen] == ["IOT0", "IOT4", "IOT5"]


def facts(**kw: object) -> ArrayFacts:
    base = dict(
        name="offload",
        device="/dev/md/offload",
        kernel_name="md127",
        members=("/dev/nvme0n1", "/dev/nvme4n1"),
        mountpoints=("/mnt/offload",),
        holders=(),
        open_by=(),
        swap=False,
        conf_lines=(("/etc/mdadm/mdadm.conf", "ARRAY /dev/md/offload x"),),
        fstab_lines=(("/etc/fstab", "UUID=u /mnt/offload xfs noatime 0 0"),),
    )
    base.update(kw)
    return ArrayFacts(**base)  # type: ignore[arg-type]


def test_destroy_plan_order() -> None:
    steps = plan_destroy(facts(), wipe_members=True, setup=SETUP)
    assert [s.kind for s in steps] == [
        "umount",
        "unfstab",
        "unconf",
        "initramfs",
        "stop",
        "zero",
        "wipe",
        "wipe",
    ]
    assert steps[5].argv == ("mdadm", "--zero-superblock", "/dev/nvme0n1", "/dev/nvme4n1")
    assert steps[1].describe() == "remove from /etc/fstab: UUID=u /mnt/offload xfs noatime 0 0"


def test_destroy_refuses_a_busy_volume() -> None:
    with pytest.raises(Refused) as info:
        plan_destroy(
            facts(open_by=("pid 42 (python3) has /mnt/offload/opt.swp open",), holders=("dm-0",)),
            wipe_members=False,
            setup=SETUP,
        )
    assert info.value.reasons == [
        "/dev/md/offload is busy: pid 42 (python3) has /mnt/offload/opt.swp open",
        "/dev/md/offload is held by dm-0 (remove that first)",
    ]
