"""The workload's end, on every exit path of a trace: SIGTERM taken as Ctrl-C
(:class:`Terminated`), both signals held until a loop's next turn where they must not land
inside its work (:class:`DeferredStop`), and the workload stopped: signalled, given time,
then killed, its process group with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from types import FrameType
from typing import Any


class Terminated(Exception):
    """SIGTERM arrived: treated like Ctrl-C, results are still written."""


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


class DeferredStop:
    """Ctrl-C and SIGTERM taken at a loop's next turn, not where they come: between two
    pieces of its work, never inside one. Made before the loop's start-up (it keeps the
    handlers it finds, and ``restore`` puts them back); ``arm`` as the loop begins; ``check``
    at each turn raises KeyboardInterrupt or :class:`Terminated` for a signal that came;
    *wake* ends the loop's sleep at once."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self.signum: int | None = None
        self._old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def _take(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        self.wake()

    def arm(self) -> None:
        for s in self._old:
            signal.signal(s, self._take)

    def check(self) -> None:
        if self.signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.signum == signal.SIGTERM:
            raise Terminated

    def restore(self) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)


def stop_child(
    child: subprocess.Popen[Any], sig: int, group: bool = False, patience: float = 15.0
) -> None:
    """Signal the workload (its whole process group when it has one), give it *patience*
    seconds, then kill it. A second Ctrl-C meanwhile must not skip this and leave it running."""

    def send(s: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(child.pid, s)
            else:
                child.send_signal(s)

    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        send(sig)
        try:
            child.wait(timeout=patience)
        except subprocess.TimeoutExpired:
            send(signal.SIGKILL)
            # not for ever: a process waiting on a lost namespace's queued I/O cannot die
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=patience)
        if group:
            send(signal.SIGKILL)  # helper processes the workload left behind
    finally:
        signal.signal(signal.SIGINT, old_int)
