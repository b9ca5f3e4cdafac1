"""torch's build lock in an op's build folder: one left by a stopped build is removed, one a
live process holds is kept (iotune/workers/built_ops.py). Real files, real processes, the
kernel's own table of open files, and torch's own FileBaton."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from iotune.workers.built_ops import LOCK, free_stale_lock, lock_holders

pytestmark = pytest.mark.unit

HOLD = "import sys, time; f = open(sys.argv[1]); print('open', flush=True); time.sleep(600)"


def test_no_lock_is_no_note(tmp_path: Path) -> None:
    assert free_stale_lock(str(tmp_path)) is None
    assert lock_holders(str(tmp_path / LOCK)) == []


def test_a_lock_no_process_holds_is_removed_and_torch_goes_on(tmp_path: Path) -> None:
    from torch.utils.file_baton import FileBaton

    lock = tmp_path / LOCK
    # what a build stopped by Ctrl-C leaves: torch's baton taken, its process gone
    left = FileBaton(str(lock))
    assert left.try_acquire()
    assert left.fd is not None
    os.close(left.fd)
    assert lock_holders(str(lock)) == []
    waiter = FileBaton(str(lock), wait_seconds=0.01)
    assert not waiter.try_acquire()
    # torch's loader would wait here for ever: the lock stays
    done = threading.Event()
    t = threading.Thread(target=lambda: (waiter.wait(), done.set()), daemon=True)
    t.start()
    assert not done.wait(0.3)

    note = free_stale_lock(str(tmp_path))
    assert note is not None and note.startswith(f"removed {lock}")
    assert not lock.exists()
    assert done.wait(10), "torch's wait did not end once the lock was removed"
    assert waiter.try_acquire()
    waiter.release()


def test_a_lock_a_live_process_holds_is_kept_and_named(tmp_path: Path) -> None:
    lock = tmp_path / LOCK
    lock.write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        assert lock_holders(str(lock)) == [holder.pid]
        note = free_stale_lock(str(tmp_path))
        assert note == f"waiting on the build of process {holder.pid}, which holds {lock}"
        assert lock.exists()
    finally:
        holder.kill()
        holder.wait()
    # its holder gone (a build killed mid-way): stale now
    deadline = time.monotonic() + 10
    while lock_holders(str(lock)) and time.monotonic() < deadline:
        time.sleep(0.05)
    note = free_stale_lock(str(tmp_path))
    assert note is not None and note.startswith("removed") and not lock.exists()


def test_the_same_name_on_another_file_is_not_a_holder(tmp_path: Path) -> None:
    """A process holding a different file (another inode, even of the same name once) does
    not keep the lock: the match is the kernel's device and inode, not the name."""
    lock = tmp_path / LOCK
    lock.write_text("")
    other = tmp_path / "other"
    other.write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(other)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        assert holder.pid not in (lock_holders(str(lock)) or [])
        assert lock_holders(str(other)) == [holder.pid]
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_that_cannot_be_removed_is_said_not_raised(tmp_path: Path) -> None:
    """A build folder the process may not write (a read-only mount, another user's cache):
    the op's load goes on to torch's wait, and the note says why the lock stayed."""
    import errno
    from unittest import mock

    lock = tmp_path / LOCK
    lock.write_text("")
    refused = OSError(errno.EROFS, os.strerror(errno.EROFS))
    with mock.patch("iotune.workers.built_ops.os.unlink", side_effect=refused):
        note = free_stale_lock(str(tmp_path))
    assert note == (
        f"waiting on {lock}, left by a stopped build: it cannot be removed "
        f"({os.strerror(errno.EROFS)})"
    )
    assert lock.exists()
