"""Worker: DeepSpeed's own launcher (``deepspeed`` on the command line) for a multi-rank run.

    python -m iotune.workers.launch [DEEPSPEED RUNNER ARGS] --module iotune.workers.train SPEC
    python -m iotune.workers.launch --launch [DEEPSPEED LAUNCH ARGS] --module ... SPEC

The tracer starts this wrapper as the leader of its own process group; it runs
deepspeed.launcher.runner, which starts deepspeed.launcher.launch on this node (or on every
node of a hostfile), which starts one training worker per rank and stops them all when one
fails or it is signalled. With ``--launch`` (ranks on this node only, where a zygote serves
it: iotune.train.launch) it starts deepspeed.launcher.launch itself, forked from the zygote
through its client, with the world the runner would have given it: the runner only works
that out, and each of the two would otherwise import torch and DeepSpeed anew. The client
stays in this group until the launch has stopped every rank. The wrapper adds two things:
after a signal it stays until every process of its group has stopped (DeepSpeed's runner
returns at once), so the tracer's last sample follows the ranks' last I/O; when iotune
itself dies (a kill -9) the kernel sends it a SIGTERM, which it passes to the whole group,
so no rank is left writing swap files; and once the ranks are gone it removes the
shared-memory workspaces that DeepSpeed's CPU allreduce creates in /dev/shm and never
unlinks (66 MiB per rank and run, shm.cpp).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from iotune.proc import module_args
from iotune.workers import die_with_parent

#: how long the ranks get to stop after a signal (DeepSpeed's launch gives its ranks 30 s)
STOP_S = 40.0
RUNNER = "deepspeed.launcher.runner"
#: the first argument where DeepSpeed's launch's arguments follow, not its runner's
LOCAL_LAUNCH = "--launch"
#: set (to 1) for a run over ssh that traces each node (iotune.train.nodes)
NODES_ENV = "IOTUNE_NODES"


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


#: shm.cpp: SHM_BUFFER_NAME "_" uid "_" MASTER_ADDR "_" MASTER_PORT "_" rank, in /dev/shm
SHM_WORKSPACE = "deepspeed_allreduce_buffer"


def shm_workspaces(port: str, shm: Path = Path("/dev/shm")) -> list[Path]:  # noqa: S108
    """DeepSpeed's CPU allreduce workspaces of the run on *port* (this user's)."""
    return sorted(shm.glob(f"{SHM_WORKSPACE}_{os.getuid()}_*_{port}_*"))


def master_port(argv: list[str]) -> str | None:
    """The run's port: ``--master_port P`` (the runner's arguments), ``--master_port=P`` (the
    launch's)."""
    for i, a in enumerate(argv):
        if a == "--master_port" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--master_port="):
            return a.partition("=")[2]
    return None


def remove_workspaces(port: str | None, shm: Path = Path("/dev/shm")) -> list[Path]:  # noqa: S108
    """Remove the workspaces of the run on *port* (the ranks are gone); what was removed."""
    gone = shm_workspaces(port, shm) if port else []
    for f in gone:
        f.unlink(missing_ok=True)
    return gone


def main() -> int:
    try:
        return run(sys.argv[1:])
    finally:
        # this node's only: on the other nodes of a hostfile run over ssh DeepSpeed's
        # launch runs without this wrapper
        remove_workspaces(master_port(sys.argv[1:]))


def run(args: list[str]) -> int:
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
    # several nodes over ssh: the runner whose pdsh command starts iotune's node entry
    if args[:1] == [LOCAL_LAUNCH]:
        started = module_args("deepspeed.launcher.launch", *args[1:])
    else:
        runner = "iotune.workers.pdsh_nodes" if os.environ.get(NODES_ENV) else RUNNER
        started = [runner, *args]
    child = subprocess.Popen([sys.executable, "-u", "-m", *started])
    while child.poll() is None and not stopping:
        time.sleep(0.2)
    if not stopping:
        return child.returncode
    # DeepSpeed's runner returns at once on a signal while its launch still stops the
    # ranks: stay until every process of the group is gone, so the tracer's last sample
    # comes after the ranks' last I/O
    deadline = time.monotonic() + STOP_S
    while members := group_members(os.getpgrp(), os.getpid()):
        if time.monotonic() > deadline:
            # each one but this wrapper, which still has to clean up after them
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    return 128 + stopping[0]


if __name__ == "__main__":
    sys.exit(main())
