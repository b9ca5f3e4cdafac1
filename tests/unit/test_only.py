"""The filter's inputs (iotune/trace/only.py): a process and the tree below it, a cgroup v2
directory, the one-line errors; the check under a filter."""

from __future__ import annotations

from pathlib import Path

import pytest

from iotune.errors import UsageError
from iotune.trace import model, only
from iotune.trace.diskstats import DiskStat

pytestmark = pytest.mark.unit


def _proc(tmp: Path, tree: dict[int, tuple[str, int]]) -> Path:
    for pid, (comm, ppid) in tree.items():
        d = tmp / str(pid)
        d.mkdir()
        (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1\n")
    (tmp / "self").mkdir()  # not a pid
    return tmp


def test_a_process_and_everything_below_it(tmp_path: Path) -> None:
    # a comm with spaces and parentheses, as /proc/PID/stat allows
    proc = _proc(
        tmp_path,
        {
            1: ("init", 0),
            10: ("python", 1),
            11: ("pt_main (x) 1", 10),
            12: ("aio", 11),
            20: ("fio", 1),
        },
    )
    assert sorted(only.descendants(10, proc)) == [10, 11, 12]
    assert only.descendants(20, proc) == [20]


def test_a_process_that_does_not_exist_is_one_line(tmp_path: Path) -> None:
    proc = _proc(tmp_path, {1: ("init", 0)})
    only.check_pid(1, proc)
    for pid in (999999, 0, -3):
        with pytest.raises(UsageError, match="no such process") as exc:
            only.check_pid(pid, proc)
        assert exc.value.hint


def test_a_cgroup_is_a_directory_under_a_cgroup2_mount(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    (root / "job").mkdir(parents=True)
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {root} cgroup2 rw,nosuid 0 0\ntmpfs /tmp tmpfs rw 0 0\n")
    assert only.cgroup_dir(str(root / "job"), mounts) == root / "job"
    assert only.cgroup_dir(str(root / "job" / ".."), mounts) == root  # the root is one too
    for bad in (tmp_path, root / "missing"):
        with pytest.raises(UsageError, match="not a cgroup v2 directory") as exc:
            only.cgroup_dir(str(bad), mounts)
        assert exc.value.hint


def test_under_a_filter_the_check_is_a_share_of_the_drives() -> None:
    ops = {
        "read": model.OpStats(0, 0, 0, 0),
        "write": model.OpStats(64 * 65536, 64, 0, 64),
    }
    kernel = DiskStat(5, 40, 96, 8192, 0, 0, 0)
    got = only.check(ops, kernel, 4242, None)
    assert got["exact"] is None
    assert (
        got["summary"]
        == "only pid 4242's requests: reads 0 of the drive's 5, writes 64 of the drive's 96"
    )
    assert only.describe(None, None) is None and only.describe(7, None) == {"pid": 7}
