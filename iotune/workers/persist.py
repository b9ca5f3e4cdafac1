"""A save taken as a snapshot, then persisted beside the training (``--checkpoint-persist``).

With ``--checkpoint-copy reflink`` a save clones the swap files into its tag folder on the
offload volume: the step waits only for their extents to be cloned. That folder is a
snapshot, on the drives the run swaps to, without their parity. Here it is copied into the
persist folder, a volume of its own (a RAID5/6), by the aio copy (O_DIRECT through
DeepSpeed's async I/O op), in a process of its own while the next steps train: every file
of the tag durable, then its folders, then that folder's ``latest``; then the snapshot is
removed from the offload volume, where, once the next step has rewritten the swap files, it
holds a whole copy of the state. The next save, and the run's end, wait for it. Killed or
powered off at any point, the persist folder's ``latest`` names a whole checkpoint: the one
before, until the new one is durable. CheckFreq's snapshot and persist (USENIX FAST '21),
for state that already lives on NVMe.

    python -m iotune.workers.persist SNAPSHOTS DIR TAG [AIO_JSON]   # one tag; a JSON line
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from iotune.workers.checkpoints import RunFails


class Persister:
    """One node's persists, one at a time: started by its local rank 0 after each save, and
    waited for before the next and at the run's end."""

    def __init__(self, snapshots: Path, dest: Path, aio: dict[str, Any] | None) -> None:
        self.snapshots, self.dest, self.aio = snapshots, dest, aio
        self.proc: subprocess.Popen[str] | None = None
        self.tag = ""
        self.step = 0
        self.t0 = 0.0

    @classmethod
    def for_rank(cls, ck: dict[str, Any] | None) -> Persister | None:
        """The persister of this rank: local rank 0's, where the run persists its saves."""
        if not ck or not ck.get("persist") or int(os.environ.get("LOCAL_RANK", "0")) != 0:
            return None
        return cls(Path(ck["dir"]), Path(ck["persist"]), ck.get("aio"))

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, tag: str, step: int) -> None:
        """Copy the saved *tag* (the save after *step*) into the persist folder, in the
        background."""
        from iotune.proc import command

        # forked from the host's zygote where there is one (its imports and the aio op's
        # load done): where Python is slow (an emulated guest) a copy's own start is minutes
        argv = command(__name__, str(self.snapshots), str(self.dest), tag)
        self.proc = subprocess.Popen(
            [*argv, json.dumps(self.aio or {})],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.tag, self.step, self.t0 = tag, step, time.perf_counter()

    def wait(self) -> dict[str, Any] | None:
        """The last persist's event, once it is durable (None: none started since the last
        wait): what it copied, how long it took from the save's end, and how long this
        wait held the training. It carries its save's step: the trace's interval it ends,
        ``persist:STEP``, holds the wait, and the copy's I/O is that of the intervals from its
        save's end to it (iotune.train.checkpoint.save_rows)."""
        if self.proc is None:
            return None
        t = time.perf_counter()
        out, err = self.proc.communicate()
        now = time.perf_counter()
        code, self.proc = self.proc.returncode, None
        if code != 0:
            why = (err.strip().splitlines() or [f"exit status {code}"])[-1]
            raise RunFails(f"the copy of save {self.tag} into {self.dest} failed: {why}")
        return {
            "event": "persist",
            "step": self.step,
            "tag": self.tag,
            "dir": str(self.dest),
            **json.loads(out.strip().splitlines()[-1]),
            "seconds": round(now - self.t0, 4),
            "waited_s": round(now - t, 4),
        }


def persist(snapshots: Path, dest: Path, tag: str, aio: dict[str, Any] | None) -> dict[str, Any]:
    """Copy *tag* from *snapshots* into *dest* by the aio copy, durable, then *dest*'s
    ``latest``; then remove the snapshot. Its figures."""
    from iotune.workers.durable import fsync_path, write_latest
    from iotune.workers.swapcopy import copy_tree, settings_of

    src = snapshots / tag
    # durable when it returns: every file, every folder bottom up, and dest itself
    rec = copy_tree(src, dest / tag, "aio", settings=settings_of(aio))
    t = time.perf_counter()
    write_latest(dest, tag)  # then latest, atomically
    latest_s = time.perf_counter() - t
    shutil.rmtree(src)
    fsync_path(snapshots, directory=True)
    for script in snapshots.glob("*.py"):  # DeepSpeed's zero_to_fp32.py, beside the tags
        if not (dest / script.name).exists():
            shutil.copy2(script, dest / script.name)
    return {
        "files": rec.files,
        "bytes": rec.bytes,
        "copy_s": round(rec.seconds, 4),
        "latest_s": round(latest_s, 4),
    }


def main(argv: list[str]) -> int:
    from iotune.workers.swapcopy import CopyError

    snapshots, dest, tag = Path(argv[0]), Path(argv[1]), argv[2]
    aio = json.loads(argv[3]) if len(argv) > 3 else None
    try:
        print(json.dumps(persist(snapshots, dest, tag, aio)), flush=True)
    except CopyError as e:
        print(str(e), file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{e.filename or dest}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
