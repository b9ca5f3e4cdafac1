"""An NVMe drive's SMART / health information log (log page 02h of the NVMe base
specification, figure "SMART / Health Information Log"), read with the kernel's admin
passthrough ioctl on the controller's character device (what ``nvme smart-log`` does).
Read-only; needs root (CAP_SYS_ADMIN). The page's layout is parsed apart from the ioctl, so
recorded pages test it.

Data units are thousands of 512-byte units (the specification: a value of 1 is 512,000
bytes), rounded up by the drive. "Percentage used" is the vendor's estimate of the life used,
which may exceed 100.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from iotune.probes.sysfs import SysTree

#: bytes in one data unit of the health log
DATA_UNIT = 512_000
#: _IOWR('N', 0x41, struct nvme_passthru_cmd): linux/nvme_ioctl.h NVME_IOCTL_ADMIN_CMD
NVME_IOCTL_ADMIN_CMD = 0xC0484E41
#: struct nvme_passthru_cmd: opcode, flags, rsvd1, nsid, cdw2, cdw3, metadata, addr,
#: metadata_len, data_len, cdw10..cdw15, timeout_ms, result (72 bytes)
_PASSTHRU = struct.Struct("<BBHIIIQQII6III")
GET_LOG_PAGE = 0x02
SMART_LOG = 0x02
PAGE = 512


def _u128(page: bytes, off: int) -> int:
    return int.from_bytes(page[off : off + 16], "little")


@dataclass(frozen=True)
class Health:
    critical_warning: int
    temperature_k: int
    available_spare: int  # percent
    spare_threshold: int  # percent
    percentage_used: int  # the vendor's estimate of life used, percent (may pass 100)
    data_units_read: int
    data_units_written: int
    power_on_hours: int
    unsafe_shutdowns: int
    media_errors: int

    @property
    def written_bytes(self) -> int:
        return self.data_units_written * DATA_UNIT

    @property
    def read_bytes(self) -> int:
        return self.data_units_read * DATA_UNIT

    @property
    def life_writes(self) -> float | None:
        """The bytes the drive would write over its whole rated life, extrapolated from what
        it has written and the life it says that used; None below 1% used (too little wear
        to extrapolate)."""
        if self.percentage_used < 1:
            return None
        return self.written_bytes * 100 / self.percentage_used

    def to_json(self) -> dict[str, object]:
        return {
            "critical_warning": self.critical_warning,
            "temperature_c": self.temperature_k - 273 if self.temperature_k else None,
            "available_spare_pct": self.available_spare,
            "spare_threshold_pct": self.spare_threshold,
            "percentage_used": self.percentage_used,
            "data_read_bytes": self.read_bytes,
            "data_written_bytes": self.written_bytes,
            "power_on_hours": self.power_on_hours,
            "unsafe_shutdowns": self.unsafe_shutdowns,
            "media_errors": self.media_errors,
            "life_writes_bytes": self.life_writes,
        }


def parse_health(page: bytes) -> Health:
    """The fields of a 512-byte SMART / health information log page."""
    if len(page) < PAGE:
        raise ValueError(f"a health log page is {PAGE} bytes, got {len(page)}")
    return Health(
        critical_warning=page[0],
        temperature_k=int.from_bytes(page[1:3], "little"),
        available_spare=page[3],
        spare_threshold=page[4],
        percentage_used=page[5],
        data_units_read=_u128(page, 32),
        data_units_written=_u128(page, 48),
        power_on_hours=_u128(page, 128),
        unsafe_shutdowns=_u128(page, 144),
        media_errors=_u128(page, 160),
    )


def controller_of(tree: SysTree, disk: str) -> str | None:
    """The controller (``nvme0``) behind an NVMe namespace's block device (``nvme0n1``)."""
    if not tree.exists(f"sys/block/{disk}/device"):
        return None
    name = Path(tree.realpath(f"sys/block/{disk}/device")).name
    return name if name.startswith("nvme") and name[4:].isdigit() else None


def read_health(controller: str, dev: Path = Path("/dev")) -> Health | None:
    """The controller's health log through the admin passthrough ioctl; None where it cannot
    be read (no such device, not root, a controller that refuses the command)."""
    buf = ctypes.create_string_buffer(PAGE)
    numd = PAGE // 4 - 1
    cmd = bytearray(
        _PASSTHRU.pack(
            GET_LOG_PAGE,
            0,
            0,
            0xFFFFFFFF,  # the controller's log, not one namespace's
            0,
            0,
            0,
            ctypes.addressof(buf),
            0,
            PAGE,
            SMART_LOG | (numd << 16),
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        )
    )
    try:
        fd = os.open(dev / controller, os.O_RDONLY)
    except OSError:
        return None
    try:
        status = fcntl.ioctl(fd, NVME_IOCTL_ADMIN_CMD, cmd)
    except OSError:
        return None
    finally:
        os.close(fd)
    if status != 0:  # an NVMe status code: the controller refused it
        return None
    return parse_health(buf.raw)
