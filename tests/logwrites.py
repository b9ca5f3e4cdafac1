"""Device-mapper's ``log-writes`` target, read back: its log of every write a volume took, in
the order the writes became durable (flushes and FUA writes in their places, marks a program
set with ``dmsetup message DEV 0 mark NAME``), replayed onto an image of the volume up to any
entry, as xfstests' replay-log does (its format: the kernel's drivers/md/dm-log-writes.c).
A crash (power lost) can leave the volume as it is at any flush or FUA write of the log: the
vm tier replays to each of them and looks at what a program left there
(tests/vm/test_powerloss_vm.py).

Log layout (little-endian): sector 0 the super (magic, version, entries, sector size); then
each entry, a sector whose first 32 bytes are (sector, sectors, flags, data length) and,
for a mark, its name after them; a write's data follows its entry, ``sectors`` sectors of
it (a discard has none). Sectors are of the log's sector size.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0x6A736677736872
VERSION = 1
FLUSH, FUA, DISCARD, MARK = 1, 2, 4, 8
_SUPER = struct.Struct("<QQQI")
_ENTRY = struct.Struct("<QQQQ")
#: fallocate(2)'s FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE: a discard back to a hole
_PUNCH = 0x01 | 0x02


class LogError(ValueError):
    """Not a log-writes log, or one cut short."""


@dataclass(frozen=True)
class Entry:
    index: int
    sector: int
    sectors: int
    flags: int
    #: a mark's name (None for any other entry)
    mark: str | None
    #: where its data starts in the log, in bytes
    data_at: int

    @property
    def durable_point(self) -> bool:
        """A flush or a FUA write: what the volume held up to here survives a crash."""
        return bool(self.flags & (FLUSH | FUA))


def read_log(path: Path) -> tuple[int, list[Entry]]:
    """The log's sector size and its entries."""
    with path.open("rb") as f:
        head = f.read(_SUPER.size)
        if len(head) < _SUPER.size:
            raise LogError(f"{path}: no log-writes super")
        magic, version, count, sector_size = _SUPER.unpack(head)
        if magic != MAGIC or version != VERSION:
            raise LogError(f"{path}: not a log-writes log (magic {magic:#x}, version {version})")
        size = path.stat().st_size if path.is_file() else f.seek(0, os.SEEK_END)
        entries, pos = [], sector_size
        for i in range(count):
            f.seek(pos)
            raw = f.read(sector_size)
            if len(raw) < _ENTRY.size:
                raise LogError(f"{path}: entry {i} of {count} past the log's end")
            sector, sectors, flags, data_len = _ENTRY.unpack_from(raw)
            mark = raw[_ENTRY.size : _ENTRY.size + data_len].decode() if flags & MARK else None
            pos += sector_size
            entries.append(Entry(i, sector, sectors, flags, mark, pos))
            if not flags & DISCARD:
                pos += sectors * sector_size
            if pos > size:
                raise LogError(f"{path}: entry {i}'s data past the log's end")
    return sector_size, entries


class Replay:
    """An image of the logged volume (*size* bytes, sparse, all zeros at first, as the
    volume was when the target was made on a blank drive), brought forward entry by entry."""

    def __init__(self, log: Path, image: Path, size: int) -> None:
        self.log = log
        self.sector_size, self.entries = read_log(log)
        self.image = image
        with image.open("wb") as f:
            f.truncate(size)
        self.done = 0  # entries applied

    def to(self, index: int) -> None:
        """Apply every entry up to *index*, included."""
        libc = ctypes.CDLL(None, use_errno=True)
        ss = self.sector_size
        with self.log.open("rb") as log, self.image.open("r+b") as img:
            for e in self.entries[self.done : index + 1]:
                if e.sectors and e.flags & DISCARD:
                    if libc.fallocate(img.fileno(), _PUNCH, ctypes.c_long(e.sector * ss),
                                      ctypes.c_long(e.sectors * ss)) != 0:  # fmt: skip
                        raise OSError(ctypes.get_errno(), "fallocate(PUNCH_HOLE)")
                elif e.sectors:
                    log.seek(e.data_at)
                    data = log.read(e.sectors * ss)
                    img.seek(e.sector * ss)
                    img.write(data)
        self.done = max(self.done, index + 1)

    def copy(self, to: Path) -> None:
        """The image as it stands now, into a new file *to*: its data extents only (it
        stays sparse)."""
        with to.open("wb") as dst:
            dst.truncate(self.image.stat().st_size)
        copy_into(self.image, to)


def copy_into(src: Path, dst: Path) -> None:
    """*src*'s data extents written into *dst* in place (a file another process holds open,
    a drive's image: not replaced), where *dst* holds zeros elsewhere."""
    with src.open("rb") as s, dst.open("r+b") as d:
        for start, end in _extents(s.fileno(), os.fstat(s.fileno()).st_size):
            off = start
            while off < end:
                n = os.copy_file_range(s.fileno(), d.fileno(), end - off, off, off)
                if n == 0:
                    raise OSError(f"copy_file_range stopped at {off} of {dst}")
                off += n


def _extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    off = 0
    while off < size:
        try:
            start = os.lseek(fd, off, os.SEEK_DATA)
        except OSError:  # ENXIO: no data past off
            return
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, end
        off = end


def points(entries: list[Entry], after_mark: str) -> list[int]:
    """The entries a crash may stop the volume at, from the mark *after_mark* on: the mark,
    each flush and FUA write after it, and the log's last entry."""
    start = next((e.index for e in entries if e.mark == after_mark), None)
    if start is None:
        raise LogError(f"no mark {after_mark!r} in the log")
    out = [start, *(e.index for e in entries[start + 1 :] if e.durable_point)]
    if out[-1] != entries[-1].index:
        out.append(entries[-1].index)
    return out
