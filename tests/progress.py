"""Waiting on a long build as a hang detector, not a stopwatch: DeepSpeed's ops compile for
minutes on a host whose compiler cache is cold (585 s for the three host ops on a quiet
2-core AMD EPYC, more with the guests' set-up beside), so a fixed limit either fails a fresh
host or hides a hang for half an hour. A wait here fails only when the process it waits on
has used no CPU at all, itself and everything it started, for a while: then it names what
ran in its session and the last lines of its log."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

#: seconds without any CPU used by a waited-on session before it is called a hang
IDLE = 300.0


def renice_session(sid: int, nice: int) -> None:
    """Every process of session *sid* (its process group, started with
    ``start_new_session=True``), and its autogroup, at CPU priority *nice*: under autogroup
    scheduling the kernel weighs a session against the others by the group's nice alone.
    Best effort: a priority is no test's result (gone, not allowed)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PGRP, sid, nice)
    with contextlib.suppress(OSError):  # no such file where the kernel has no autogroups
        Path(f"/proc/{sid}/autogroup").write_text(str(nice))


def following(sid: int) -> Callable[[], None]:
    """A call that puts session *sid* at the calling thread's CPU priority whenever that has
    changed since its last call (and at its first): for a wait on a process that a thread
    started at one priority and a test may raise to another meanwhile (tests/vm/guest.Early's
    ``take``)."""
    nice: int | None = None

    def follow() -> None:
        nonlocal nice
        if nice != (now := os.getpriority(os.PRIO_PROCESS, 0)):
            nice = now
            renice_session(sid, now)

    return follow


def session_cpu(sid: int) -> tuple[float, list[str]]:
    """CPU seconds (user and system, with its reaped children's) of every live process in
    session *sid*, and each one's ``PID STATE NAME``."""
    tick = os.sysconf("SC_CLK_TCK")
    total, procs = 0.0, []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        f = rest.split()
        if int(f[3]) != sid:  # the session: field 6 of proc(5)'s stat
            continue
        total += sum(int(x) for x in f[11:15]) / tick  # utime, stime, cutime, cstime
        procs.append(f"{entry} {f[0]} {name}")
    return total, procs


def wait_busy(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str],
    ready: Callable[[], bool],
    what: str,
    log: Path | None = None,
    idle: float = IDLE,
) -> None:
    """Wait until *ready()*, while *proc* (started with ``start_new_session=True``) lives
    and its session keeps using CPU; raise RuntimeError naming what it was doing when it
    exits first or uses none for *idle* seconds."""
    last_cpu, last_t = -1.0, time.monotonic()
    while not ready():
        if proc.poll() is not None:
            if ready():
                return
            raise RuntimeError(f"{what} exited {proc.returncode}{_tail(log)}")
        cpu, procs = session_cpu(proc.pid)
        now = time.monotonic()
        if cpu > last_cpu:
            last_cpu, last_t = cpu, now
        elif now - last_t > idle:
            raise RuntimeError(
                f"{what} used no CPU for {idle:.0f} s (after {cpu:.0f} s of CPU): a hang; its "
                f"processes: {'; '.join(procs) or 'none'}{_tail(log)}"
            )
        time.sleep(1.0)


def _tail(log: Path | None) -> str:
    if log is None:
        return ""
    try:
        return "\n" + log.read_text(errors="replace")[-3000:]
    except OSError:
        return ""
