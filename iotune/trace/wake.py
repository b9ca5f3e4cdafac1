"""What a trace sleeps on between its samples, and the kernel's inotify it uses.

A trace samples the drives' counters once a second, and at once where the workload appends
a step event to its events file. Looking at that file twenty times a second costs little on
a host's own CPU, but where Python itself is slow (an emulated guest: thirty times) the
looks alone took 16% of a CPU. So the loop sleeps until one of these, whichever comes
first:

- the events file is written to (inotify, IN_MODIFY: every append wakes it);
- the workload ends (its pidfd becomes readable);
- a thread of this process has written an event (``set``: a byte through a pipe);
- the next periodic sample is due.

Where inotify or pidfd cannot be had, it looks every ``POLL_S`` as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import select
import struct
from pathlib import Path

from iotune.errors import IotuneError

#: inotify(7)
IN_MODIFY = 0x002
IN_CLOSE_WRITE = 0x008
IN_OPEN = 0x020
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")
#: how often a trace looks at the events file where it cannot be woken by it
POLL_S = 0.05


class Inotify:
    """The kernel's inotify through libc: watches and their events, nothing more."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            err = ctypes.get_errno()
            raise IotuneError(
                f"inotify is not available: {os.strerror(err)}",
                hint="the swap-folder step watch needs inotify (fs.inotify.max_user_instances)",
            )

    def add(self, path: Path, mask: int) -> int | None:
        """Watch a folder or a file for the events in *mask*; None when it is gone (or
        cannot be watched)."""
        wd = int(self._add(self.fd, os.fsencode(path), mask))
        return wd if wd >= 0 else None

    def read(self, timeout: float) -> list[tuple[int, int, str]]:
        """The events queued within *timeout* seconds: (watch, mask, name)."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        out: list[tuple[int, int, str]] = []
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return out
            off = 0
            while off < len(buf):
                wd, mask, _cookie, n = _EVENT.unpack_from(buf, off)
                name = buf[off + _EVENT.size : off + _EVENT.size + n].rstrip(b"\0")
                out.append((wd, mask, os.fsdecode(name)))
                off += _EVENT.size + n

    def close(self) -> None:
        os.close(self.fd)


class Wake:
    """The trace loop's sleep (module docstring). ``set`` may be called from any thread."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._ino: Inotify | None = None
        self._pidfd: int | None = None
        #: False where a change could go unseen (no inotify on the events file, or no pidfd
        #: for a workload): the sleep is then at most POLL_S
        self.woken_by_kernel = True

    def watch(self, events: Path) -> None:
        """Wake on each write to *events* (the file must exist)."""
        try:
            ino = Inotify()
        except IotuneError:
            self.woken_by_kernel = False
            return
        if ino.add(events, IN_MODIFY) is None:
            ino.close()
            self.woken_by_kernel = False
            return
        self._ino = ino

    def child(self, pid: int) -> None:
        """Wake when the process *pid* (a child of this one) ends."""
        try:
            self._pidfd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            self.woken_by_kernel = False

    def set(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # a full pipe wakes it anyway
            os.write(self._w, b"\n")

    def wait(self, timeout: float) -> None:
        """Until something above happens or *timeout* seconds pass; what woke it is read
        and dropped (the loop looks at everything after each wake)."""
        if not self.woken_by_kernel:
            timeout = min(timeout, POLL_S)
        fds = [self._r]
        if self._pidfd is not None:
            fds.append(self._pidfd)
        if self._ino is not None:
            fds.append(self._ino.fd)
        ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
        if self._r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(self._r, 4096):
                    pass
        if self._ino is not None and self._ino.fd in ready:
            self._ino.read(0)

    def close(self) -> None:
        for fd in (self._r, self._w, self._pidfd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._pidfd = None
        if self._ino is not None:
            self._ino.close()
            self._ino = None
