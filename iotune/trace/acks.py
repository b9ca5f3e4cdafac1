"""Step events that the tracer acknowledges.

The tracer takes a sample of its counters when it reads a workload's event, so the I/O
between two events is the step's. A training worker goes on at once after an event, and
its next step's I/O starts within a fraction of a second (a backward that writes gradients
to the drive): a tracer that reads the event later than that, on a host whose CPU is busy,
would count that I/O in the step before. So a worker that finds ``$IOTUNE_EVENTS_ACK``
marks each of its events ``"ack": N`` (its local rank) and waits after it until the tracer
has taken its sample: one byte through that rank's FIFO. The tracer holds the FIFOs' write
ends for as long as it traces, so a worker whose tracer has gone reads the end of the file
and stops waiting. The FIFOs' folder is named for the tracer's pid: a tracer killed with
SIGKILL leaves it behind, and the next tracer on the host removes it.

Each rank of a multi-rank run has a FIFO of its own (``ack`` for local rank 0, ``ack.N`` for
the others, up to LOCAL_RANKS): one rank's byte is never another's. Without them, a rank that
went on into a save while the tracer, starved of CPU, had not yet read the last rank's step
event put the save's first writes into the step (two ranks' save in a QEMU guest: 30 of its
48 MB written to the RAID6's members before that mark, the save's own interval showing
0.82x its bytes where RAID6 writes 2x). A rank numbered from LOCAL_RANKS on goes on at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import sys
import tempfile
import time
from pathlib import Path

from iotune.proc import pid_alive

ACK_ENV = "IOTUNE_EVENTS_ACK"
#: how long a worker waits for an acknowledgement before it goes on without them: a guard
#: against a tracer that hangs, far beyond any sample's time
WAIT_S = 300.0


#: the local ranks that have a FIFO: a node's ranks, one a GPU
LOCAL_RANKS = 16
#: the FIFO's folder in the temporary directory: iotune-ack-<the tracer's pid>-<random>
PREFIX = "iotune-ack-"


class AckSender:
    """The tracer's side: a FIFO for each local rank in a private folder, the write ends
    held open."""

    def __init__(self) -> None:
        tmp = Path(tempfile.gettempdir())
        sweep_orphans(tmp)
        self._dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=tmp))
        self.path = self._dir / "ack"
        self._fds: list[int] = []
        for fifo in (fifo_of(self.path, rank) for rank in range(LOCAL_RANKS)):
            os.mkfifo(fifo, 0o600)
            # read and write: the open never blocks, and the FIFO has a writer from now on
            self._fds.append(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))

    def env(self) -> dict[str, str]:
        return {ACK_ENV: str(self.path)}

    def ack(self, mark: int = 0) -> None:
        """The sample for one event marked ``"ack": mark`` is taken: *mark* a local rank, or
        true (a workload of one process, documented in docs/commands/trace.md): rank 0."""
        local_rank = 0 if mark is True else mark
        if 0 <= local_rank < len(self._fds):
            # a full pipe (64 KiB of acknowledgements no worker reads) takes no more
            with contextlib.suppress(BlockingIOError):
                os.write(self._fds[local_rank], b"\n")

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        shutil.rmtree(self._dir, ignore_errors=True)


def fifo_of(path: Path, local_rank: int) -> Path:
    """The FIFO of *local_rank*, *path* being local rank 0's (``$IOTUNE_EVENTS_ACK``)."""
    return path if local_rank == 0 else path.with_name(f"{path.name}.{local_rank}")


def sweep_orphans(tmp: Path) -> None:
    """Remove the FIFO folders of tracers that are gone without closing (killed with
    SIGKILL)."""
    for d in tmp.glob(f"{PREFIX}*"):
        pid = d.name.removeprefix(PREFIX).partition("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


class AckWaiter:
    """The worker's side: waits for one byte after each event it marks."""

    def __init__(self, fd: int, local_rank: int = 0) -> None:
        self._fd: int | None = fd
        #: the rank whose FIFO this is: its events are marked with it
        self.local_rank = local_rank

    @classmethod
    def from_env(cls) -> AckWaiter | None:
        path = os.environ.get(ACK_ENV)
        rank = os.environ.get("LOCAL_RANK", "0") or "0"
        if not path or not rank.isdigit() or int(rank) >= LOCAL_RANKS:
            return None
        try:
            # the tracer holds the write end: opened before this worker started
            fifo = fifo_of(Path(path), int(rank))
            return cls(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), int(rank))
        except OSError:
            return None  # a tracer that has already gone: nobody to wait for

    @property
    def active(self) -> bool:
        return self._fd is not None

    def wait(self) -> None:
        """Until the tracer has sampled the event just written; no more waiting once the
        tracer is gone (the FIFO's end of file) or has not answered in WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        poll = select.poll()
        while self._fd is not None:
            try:
                got = os.read(self._fd, 1)
            except BlockingIOError:  # nothing yet, and a writer holds the FIFO: wait
                left = deadline - time.monotonic()
                if left <= 0:
                    sys.stderr.write(
                        f"iotune: the tracer did not acknowledge a step event in {WAIT_S:.0f} "
                        "s; going on without waiting for it\n"
                    )
                    self.close()
                    return
                poll.register(self._fd, select.POLLIN)
                poll.poll(int(1000 * left) + 1)
                poll.unregister(self._fd)
                continue
            if not got:  # end of file: no writer, the tracer is gone
                self.close()
            return

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
