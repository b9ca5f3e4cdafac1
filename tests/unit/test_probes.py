"""Probes over trees recorded from real machines (tests/tools/record_tree.py):

- ``ci-host``: a Debian micro-VM (virtio root disk) with loop devices: loop0 blank with
  max_sectors_kb lowered to 256, loop1 ext4 mounted at /tmp/rec/mnt, loop2 with 4 KiB
  sectors, loop3 with a GPT partition holding ext4.
- ``qemu-nvme``: a QEMU guest with six emulated NVMe drives IOT0..IOT5: IOT1 formatted
  ext4, IOT2 a member of md127 (/dev/md/held, RAID1), IOT3 ext4 mounted at /tmp/iot3.
"""

from pathlib import Path

import pytest

from iotune.errors import ProbeError
from iotune.probes.blockdev import BlockDevice, Transport, Use, find_block_devices
from iotune.probes.host import RecordedHost, parse_wipefs_json
from iotune.probes.meminfo import mem_available, meminfo
from iotune.probes.mounts import Mount, mount_of, overlay_layers, read_mounts
from iotune.probes.sysfs import SysTree

DATA = Path(__file__).resolve().parent.parent / "data"


def devices(machine: str) -> dict[str, BlockDevice]:
    return {d.name: d for d in find_block_devices(RecordedHost(DATA / machine))}


def kinds(d: BlockDevice) -> set[Use]:
    return {r.kind for r in d.in_use}


def test_qemu_nvme_identity_from_controller_sysfs() -> None:
    devs = devices("qemu-nvme")
    nvme = {d.serial: d for d in devs.values() if d.transport is Transport.NVME}
    assert sorted(map(str, nvme)) == ["IOT0", "IOT1", "IOT2", "IOT3", "IOT4", "IOT5"]
    d = nvme["IOT0"]
    assert d.model == "QEMU NVMe Ctrl"
    assert d.firmware == "7.2.22"
    assert d.size_bytes == 128 * 2**20
    assert (d.logical_block_size, d.physical_block_size) == (512, 512)
    assert d.queue.max_sectors_kb == 512 and d.queue.max_hw_sectors_kb == 512
    assert d.queue.scheduler == "none"
    assert d.rotational is False
    assert d.pcie is not None and d.pcie.current_speed == "Unknown"
    assert str(d.pcie) == "? (max ?)"
    assert d.in_use == ()


def test_qemu_nvme_in_use_reasons() -> None:
    nvme = {d.serial: d for d in devices("qemu-nvme").values() if d.serial}
    assert kinds(nvme["IOT1"]) == {Use.SIGNATURE}
    assert any("ext4" in r.detail for r in nvme["IOT1"].in_use)
    assert kinds(nvme["IOT2"]) == {Use.SIGNATURE, Use.HOLDERS, Use.BUSY}
    assert nvme["IOT2"].holders == ("md127",)
    assert any("linux_raid_member" in r.detail for r in nvme["IOT2"].in_use)
    assert kinds(nvme["IOT3"]) == {Use.MOUNTED, Use.SIGNATURE, Use.BUSY}
    assert any("mounted at /tmp/iot3" in r.detail for r in nvme["IOT3"].in_use)
    assert not nvme["IOT4"].in_use and not nvme["IOT5"].in_use


def test_qemu_md_array_lists_its_members() -> None:
    md = devices("qemu-nvme")["md127"]
    assert md.transport is Transport.MD
    assert md.slaves == ("nvme2n1",)
    assert md.model == "Linux md raid1"


def test_ci_host_loop_devices() -> None:
    devs = devices("ci-host")
    assert "loop4" not in devs  # unattached loop devices (size 0) are left out
    loop0 = devs["loop0"]
    assert loop0.transport is Transport.LOOP
    assert loop0.size_bytes == 64 * 2**20
    assert loop0.queue.max_sectors_kb == 256 and loop0.queue.max_hw_sectors_kb == 1280
    assert loop0.backing_file == "/tmp/rec/blank.img"
    assert loop0.in_use == ()
    assert devs["loop2"].logical_block_size == 4096
    loop1 = devs["loop1"]
    assert kinds(loop1) == {Use.MOUNTED, Use.SIGNATURE, Use.BUSY}
    assert "loop1 is mounted at /tmp/rec/mnt (ext4)" in [r.detail for r in loop1.in_use]


def test_ci_host_partitions_and_their_signatures() -> None:
    loop3 = devices("ci-host")["loop3"]
    assert [p.name for p in loop3.partitions] == ["loop3p1"]
    assert loop3.partitions[0].start_sector == 2048
    assert Use.PARTITIONS in kinds(loop3)
    details = [r.detail for r in loop3.in_use]
    assert "ext4 signature on loop3p1 at offset 0x438" in details
    assert any(d.startswith("gpt signature on loop3") for d in details)


def test_ci_host_root_disk_is_in_use() -> None:
    vda = devices("ci-host")["vda"]
    assert vda.transport is Transport.VIRTIO
    assert {Use.ROOT, Use.MOUNTED} <= kinds(vda)


def test_mountinfo_unescapes_spaces(tmp_path: Path) -> None:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "mountinfo").write_text(
        "36 35 7:1 / /mnt/with\\040space rw,noatime shared:1 - xfs /dev/loop1 rw\n"
        "37 35 0:5 / /proc rw - proc proc rw\n"
    )
    mounts = read_mounts(SysTree(tmp_path))
    assert mounts[0].mountpoint == "/mnt/with space"
    assert (mounts[0].devno, mounts[0].fstype, mounts[0].source) == ("7:1", "xfs", "/dev/loop1")
    assert mounts[1].fstype == "proc"


def _mounts(tmp_path: Path, text: str) -> list[Mount]:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "mountinfo").write_text(text)
    return read_mounts(SysTree(tmp_path))


def test_an_overlays_layers_are_placed_as_when_it_was_mounted(tmp_path: Path) -> None:
    """A VM's /tmp (a QEMU guest as the vm tier boots it, recorded): an overlay whose lower
    layer is the 9p root's /tmp, hidden by the overlay itself, and whose upper layer is on
    tmpfs; a share mounted later on top of it is left out."""
    mounts = _mounts(
        tmp_path,
        "23 1 0:21 / / ro,relatime - 9p /dev/root ro,sync,trans=virtio\n"
        "25 23 0:23 / /run rw,relatime - tmpfs run rw,mode=755\n"
        "54 23 0:46 / /tmp rw,relatime - overlay virtme_rw_overlay7 rw,lowerdir=/tmp,"
        "upperdir=/run/tmp/virtme_rw_overlay7/upper,workdir=/run/tmp/virtme_rw_overlay7/work\n"
        "60 54 0:50 / /tmp/share rw - 9p virtme.initmount0 rw,trans=virtio\n",
    )
    top = mount_of(mounts, "/tmp/ci/.venv/lib")
    assert top is not None and top.fstype == "overlay"
    layers = overlay_layers(mounts, top)
    assert layers is not None
    assert [(m.mountpoint, m.fstype) for m in layers] == [("/", "9p"), ("/run", "tmpfs")]


def test_an_overlay_whose_layers_lie_outside_the_namespace_is_unknown(tmp_path: Path) -> None:
    """A container's root: its layers (host paths, escaped colon included) are on no mount
    the container sees, so nothing can be said of its drive."""
    mounts = _mounts(
        tmp_path,
        "500 400 0:90 / / rw - overlay overlay rw,lowerdir=/var/lib/docker/l/A\\:B:"
        "/var/lib/docker/l/C,upperdir=/var/lib/docker/x/diff,workdir=/var/lib/docker/x/work\n"
        "501 500 0:91 / /proc rw - proc proc rw\n",
    )
    top = mount_of(mounts, "/usr/lib")
    assert top is not None and top.mountpoint == "/"
    assert overlay_layers(mounts, top) is None


def test_typed_reader_raises_on_garbage(tmp_path: Path) -> None:
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / "size").write_text("lots\n")
    tree = SysTree(tmp_path)
    with pytest.raises(ProbeError, match="expected an integer"):
        tree.read_int("/sys/size")
    assert tree.read_int("/sys/absent") is None


def test_wipefs_json_parsing() -> None:
    text = (
        '{"signatures": [{"device":"sdb","offset":"0x1000","type":"linux_raid_member",'
        '"uuid":"a-b","label":"host:0"},{"device":"sdb","offset":"0x438","type":"ext4",'
        '"uuid":null,"label":null}]}'
    )
    sigs = parse_wipefs_json(text)
    assert [(s.type, s.offset, s.label) for s in sigs] == [
        ("linux_raid_member", "0x1000", "host:0"),
        ("ext4", "0x438", None),
    ]


def test_meminfo_in_bytes(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text(
        "MemTotal:       16318412 kB\nMemAvailable:    9000000 kB\nHugePages_Total:       4\n"
    )
    tree = SysTree(tmp_path)
    assert meminfo(tree) == {
        "MemTotal": 16318412 * 1024,
        "MemAvailable": 9000000 * 1024,
        "HugePages_Total": 4,
    }
    assert mem_available(tree) == 9000000 * 1024
    assert mem_available(SysTree(tmp_path / "elsewhere")) == 0
