"""Worker: DeepSpeed's own launcher (``deepspeed`` on the command line) for a multi-rank run.

    python -m iotune.workers.launch [DEEPSPEED RUNNER ARGS] --module iotune.workers.train SPEC

The tracer starts this wrapper as the leader of its own process group; it runs
deepspeed.launcher.runner, which starts deepspeed.launcher.launch on this node (or on every
node of a hostfile), which starts one training worker per rank and stops them all when one
fails or it is signalled. The wrapper adds two things: after a signal it stays until every
rank of the group has stopped (DeepSpeed's runner returns at once), so the tracer's last
sample follows the ranks' last I/O; and when iotune itself dies (a kill -9) the kernel sends
it a SIGTERM, which it passes to the whole group, so no rank is left writing swap files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from iotune.workers import die_with_parent

#: how long the ranks get to stop after a signal (DeepSpeed's launch gives its ranks 30 s)
STOP_S = 40.0


def group_members(pgid: int, skip: int) -> list[int]:
    """Live processes of process group *pgid*, from /proc/PID/stat, except *skip*."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == skip:
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def main() -> int:
    stopping: list[int] = []

    def stop(signum: int, frame: object) -> None:
        if not stopping and signum == signal.SIGTERM:
            # a SIGTERM for this process alone (iotune died): pass it to the whole group
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.killpg(os.getpgrp(), signal.SIGTERM)
        stopping.append(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    die_with_parent()
    child = subprocess.Popen(
        [sys.executable, "-u", "-m", "deepspeed.launcher.runner", *sys.argv[1:]]
    )
    while child.poll() is None and not stopping:
        time.sleep(0.2)
    if not stopping:
        return child.returncode
    # DeepSpeed's runner returns at once on a signal while its launch still stops the
    # ranks: stay until every process of the group is gone, so the tracer's last sample
    # comes after the ranks' last I/O
    deadline = time.monotonic() + STOP_S
    while group_members(os.getpgrp(), os.getpid()):
        if time.monotonic() > deadline:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        time.sleep(0.2)
    return 128 + stopping[0]


if __name__ == "__main__":
    sys.exit(main())
