"""Step events that the tracer acknowledges.

The tracer takes a sample of its counters when it reads a workload's event, so the I/O
between two events is the step's. A training worker goes on at once after an event, and
its next step's I/O starts within a fraction of a second (a backward that writes gradients
to the drive): a tracer that reads the event later than that, on a host whose CPU is busy,
would count that I/O in the step before. So a worker that finds ``$IOTUNE_EVENTS_ACK``
marks each of its events ``"ack": true`` and waits after it until the tracer has taken its
sample: one byte through a FIFO. The tracer holds the FIFO's write end for as long as it
traces, so a worker whose tracer has gone reads the end of the file and stops waiting. The
FIFO's folder is named for the tracer's pid: a tracer killed with SIGKILL leaves it behind,
and the next tracer on the host removes it.

A single process only: the ranks of a multi-rank run would take each other's bytes. They
report their steps as before (a tracer starved of CPU can then merge two steps' counts).
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


#: the FIFO's folder in the temporary directory: iotune-ack-<the tracer's pid>-<random>
PREFIX = "iotune-ack-"


class AckSender:
    """The tracer's side: a FIFO in a private folder, its write end held open."""

    def __init__(self) -> None:
        tmp = Path(tempfile.gettempdir())
        sweep_orphans(tmp)
        self._dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=tmp))
        self.path = self._dir / "ack"
        os.mkfifo(self.path, 0o600)
        # read and write: the open never blocks, and the FIFO has a writer from now on
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)

    def env(self) -> dict[str, str]:
        return {ACK_ENV: str(self.path)}

    def ack(self) -> None:
        """The sample for one acknowledged event is taken."""
        if self._fd is not None:
            # a full pipe (64 KiB of acknowledgements no worker reads) takes no more
            with contextlib.suppress(BlockingIOError):
                os.write(self._fd, b"\n")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        shutil.rmtree(self._dir, ignore_errors=True)


def sweep_orphans(tmp: Path) -> None:
    """Remove the FIFO folders of tracers that are gone without closing (killed with
    SIGKILL)."""
    for d in tmp.glob(f"{PREFIX}*"):
        pid = d.name.removeprefix(PREFIX).partition("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


class AckWaiter:
    """The worker's side: waits for one byte after each event it marks."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def from_env(cls) -> AckWaiter | None:
        path = os.environ.get(ACK_ENV)
        if not path or os.environ.get("WORLD_SIZE", "1") not in ("", "1"):
            return None
        try:
            # the tracer holds the write end: opened before this worker started
            return cls(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
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
