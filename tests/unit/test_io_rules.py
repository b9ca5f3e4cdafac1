"""The rule the training tiers judge parameter reads by (tests/io_rules.py), by hand; the
tiers' check of the free space they need (tests/conftest.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.conftest import disk_short
from tests.io_rules import FS_READS, MIB, PAGES, param_reads_shift_ok

N_P = 64 * MIB  # 256 MiB: one fetch of every file at 4 bytes an element


def test_whole_files_either_way_are_shifts() -> None:
    for off in (0, MIB, -MIB, 3 * MIB + MIB // 2, -(3 * MIB + MIB // 2), 4 * N_P, -4 * N_P):
        assert param_reads_shift_ok(off, N_P), off


def test_the_filesystems_blocks_on_top_of_a_shift_are_allowed_never_below() -> None:
    for base in (0, MIB, -MIB, -MIB // 2):
        assert param_reads_shift_ok(base + 4096, N_P), base
        assert param_reads_shift_ok(base + FS_READS, N_P), base
        assert not param_reads_shift_ok(base + FS_READS + 4096, N_P), base
        assert not param_reads_shift_ok(base - 4096, N_P), base
        assert not param_reads_shift_ok(base + 512, N_P), base


def test_more_than_one_fetch_of_every_file_is_not_a_shift() -> None:
    assert not param_reads_shift_ok(4 * N_P + MIB, N_P)
    assert not param_reads_shift_ok(-4 * N_P - MIB, N_P)
    assert param_reads_shift_ok(4 * N_P + 4096, N_P)


def test_a_models_own_files_shift_by_pages() -> None:
    assert param_reads_shift_ok(5 * 4096, N_P, PAGES)
    assert param_reads_shift_ok(-(MIB + 5 * 4096), N_P, PAGES)
    assert not param_reads_shift_ok(5 * 4096 + 512, N_P, PAGES)


def test_a_filesystem_short_of_the_tiers_peak_is_one_line_naming_it(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    assert disk_short(str(tmp_path), needed=free // 2) is None
    line = disk_short(str(tmp_path), needed=free * 2)
    assert line is not None and "\n" not in line and str(tmp_path) in line and "TMPDIR" in line
