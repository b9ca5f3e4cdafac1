"""Unit: device-mapper log-writes logs read and replayed (tests/logwrites.py), on a log
built here by hand in the kernel's layout: every entry's fields, the image after each
entry, the crash points after a mark, and logs that are not one or are cut short."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.logwrites import DISCARD, FLUSH, FUA, MAGIC, MARK, LogError, Replay, points, read_log

SS = 512


def _log(path: Path, entries: list[tuple[int, int, int, bytes]]) -> None:
    """(sector, sectors, flags, data): a write's data is its sectors' bytes, a mark's its
    name."""
    out = bytearray(struct.pack("<QQQI", MAGIC, 1, len(entries), SS).ljust(SS, b"\0"))
    for sector, sectors, flags, data in entries:
        name = data if flags & MARK else b""
        out += (struct.pack("<QQQQ", sector, sectors, flags, len(name)) + name).ljust(SS, b"\0")
        if not flags & (MARK | DISCARD):
            assert len(data) == sectors * SS
            out += data
    path.write_bytes(bytes(out))


def test_a_log_is_read_and_replayed_entry_by_entry(tmp_path: Path) -> None:
    log = tmp_path / "log"
    _log(log, [
        (0, 2, 0, b"A" * 2 * SS),          # 0: a write of two sectors
        (0, 0, FLUSH, b""),                # 1: a flush
        (0, 0, MARK, b"saved1"),           # 2: a mark
        (4, 1, 0, b"B" * SS),              # 3
        (6, 1, FUA, b"C" * SS),            # 4: a FUA write
        (0, 1, DISCARD, b""),              # 5: the first sector discarded
        (1, 1, FLUSH | FUA, b"D" * SS),    # 6: a flush and a FUA write, the last entry
    ])  # fmt: skip
    ss, entries = read_log(log)
    assert ss == SS and len(entries) == 7
    assert [(e.sector, e.sectors, e.flags, e.mark) for e in entries] == [
        (0, 2, 0, None), (0, 0, FLUSH, None), (0, 0, MARK, "saved1"), (4, 1, 0, None),
        (6, 1, FUA, None), (0, 1, DISCARD, None), (1, 1, FLUSH | FUA, None),
    ]  # fmt: skip
    # each write's data right after its entry's sector: super, entry 0, its 2 sectors, ...
    assert [e.data_at for e in entries] == [
        2 * SS,
        5 * SS,
        6 * SS,
        7 * SS,
        9 * SS,
        11 * SS,
        12 * SS,
    ]
    assert [e.durable_point for e in entries] == [False, True, False, False, True, False, True]
    assert points(entries, "saved1") == [2, 4, 6]
    with pytest.raises(LogError, match="no mark 'other'"):
        points(entries, "other")

    image = tmp_path / "image"
    r = Replay(log, image, 8 * SS)
    assert image.read_bytes() == bytes(8 * SS)
    r.to(0)
    assert image.read_bytes() == b"A" * 2 * SS + bytes(6 * SS)
    r.to(4)
    want = bytearray(b"A" * 2 * SS + bytes(6 * SS))
    want[4 * SS : 5 * SS] = b"B" * SS
    want[6 * SS : 7 * SS] = b"C" * SS
    assert image.read_bytes() == bytes(want)
    copy = tmp_path / "copy"
    r.copy(copy)
    assert copy.read_bytes() == bytes(want)
    r.to(6)
    want[0:SS] = bytes(SS)  # discarded: zeros again
    want[SS : 2 * SS] = b"D" * SS
    assert image.read_bytes() == bytes(want)
    r.to(3)  # already past it: nothing again
    assert image.read_bytes() == bytes(want)


def test_what_is_not_a_whole_log_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_bytes(bytes(SS))
    with pytest.raises(LogError, match="not a log-writes log"):
        read_log(bad)
    short = tmp_path / "short"
    _log(short, [(0, 2, 0, b"A" * 2 * SS)])
    short.write_bytes(short.read_bytes()[: 3 * SS])  # the entry's second sector cut off
    with pytest.raises(LogError, match="entry 0's data past the log's end"):
        read_log(short)
