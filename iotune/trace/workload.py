"""The workload's end, on every exit path of a trace: SIGTERM taken as Ctrl-C
(:class:`Terminated`), and the workload stopped: signalled, given time, then killed, its
process group with it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from types import FrameType
from typing import Any


class Terminated(Exception):
    """SIGTERM arrived: treated like Ctrl-C, results are still written."""


def raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated


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
