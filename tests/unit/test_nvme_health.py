"""The NVMe health log's layout (log page 02h): a page laid out as the specification's
figure gives it, and the controller behind a namespace in a recorded QEMU sysfs tree. The
ioctl itself reads QEMU's emulated controllers in the vm tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from iotune.probes.nvme_health import (
    _PASSTHRU,
    DATA_UNIT,
    NVME_IOCTL_ADMIN_CMD,
    controller_of,
    parse_health,
)
from iotune.probes.sysfs import SysTree

DATA = Path(__file__).resolve().parent.parent / "data"


def _page(**fields: int) -> bytes:
    page = bytearray(512)
    page[0] = fields.get("warning", 0)
    page[1:3] = (fields.get("kelvin", 313)).to_bytes(2, "little")
    page[3], page[4], page[5] = fields.get("spare", 100), 10, fields.get("used", 0)
    for off, key in (
        (32, "read"),
        (48, "written"),
        (128, "hours"),
        (144, "unsafe"),
        (160, "media"),
    ):
        page[off : off + 16] = fields.get(key, 0).to_bytes(16, "little")
    return bytes(page)


def test_the_health_page_read_as_the_specification_lays_it_out() -> None:
    h = parse_health(_page(written=2_343_750, read=4_687_500, used=3, hours=1234, media=2))
    assert h.written_bytes == 2_343_750 * DATA_UNIT == 1_200_000_000_000
    assert h.read_bytes == 2_400_000_000_000
    assert (h.percentage_used, h.power_on_hours, h.media_errors) == (3, 1234, 2)
    assert h.temperature_k == 313 and h.to_json()["temperature_c"] == 40
    # 1.2 TB written for 3% of its life: about 40 TB in all
    assert h.life_writes == pytest.approx(40e12)
    # a fresh drive says too little to extrapolate from
    assert parse_health(_page(written=10, used=0)).life_writes is None
    # 128-bit counters past 64 bits
    assert parse_health(_page(written=2**70)).data_units_written == 2**70
    with pytest.raises(ValueError):
        parse_health(b"\0" * 100)


def test_the_passthrough_command_is_the_kernels_72_bytes() -> None:
    assert _PASSTHRU.size == 72
    # _IOWR('N', 0x41, 72 bytes)
    assert (3 << 30) | (72 << 16) | (ord("N") << 8) | 0x41 == NVME_IOCTL_ADMIN_CMD


def test_the_controller_behind_a_namespace() -> None:
    tree = SysTree(DATA / "qemu-nvme")
    assert controller_of(tree, "nvme0n1") == "nvme0"
    assert controller_of(tree, "md127") is None and controller_of(tree, "nope") is None
