"""/sys/block/<dev>/stat: the kernel's own per-disk totals (Documentation/block/stat.rst)."""

from __future__ import annotations

from dataclasses import dataclass

from iotune.probes.sysfs import SysTree

SECTOR = 512


@dataclass(frozen=True)
class DiskStat:
    read_ios: int
    read_sectors: int
    write_ios: int
    write_sectors: int
    discard_ios: int
    discard_sectors: int
    flush_ios: int
    #: milliseconds the requests completed spent from their start to their end, all ops
    #: summed (field 11, "time_in_queue": over an interval, iostat's aqu-sz)
    time_in_queue_ms: int = 0

    def __sub__(self, other: DiskStat) -> DiskStat:
        return DiskStat(*(getattr(self, f) - getattr(other, f) for f in self.__dataclass_fields__))

    @property
    def read_bytes(self) -> int:
        return self.read_sectors * SECTOR

    @property
    def write_bytes(self) -> int:
        return self.write_sectors * SECTOR


def parse_stat(text: str) -> DiskStat:
    f = [int(x) for x in text.split()]
    f += [0] * (17 - len(f))  # discard fields since 4.18, flush since 5.5
    return DiskStat(
        read_ios=f[0],
        read_sectors=f[2],
        write_ios=f[4],
        write_sectors=f[6],
        discard_ios=f[11],
        discard_sectors=f[13],
        flush_ios=f[15],
        time_in_queue_ms=f[10],
    )


def read_stat(tree: SysTree, name: str) -> DiskStat:
    text = tree.read(f"/sys/block/{name}/stat")
    return parse_stat(text or "")


def read_inflight(tree: SysTree, name: str) -> tuple[int, int]:
    """/sys/block/<dev>/inflight: (reads, writes) issued to the driver and not yet completed."""
    text = tree.read(f"/sys/block/{name}/inflight") or "0 0"
    r, w = (int(x) for x in text.split()[:2])
    return r, w
