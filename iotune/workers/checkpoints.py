"""A run's checkpoints, saved from the training worker: DeepSpeed's ``save_checkpoint``
timed (blocked, then durable) and what it left on disk, as one event of the run's record."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Protocol


class _Events(Protocol):
    def emit(self, rec: dict[str, Any]) -> None: ...


#: the step a checkpoint was saved after, in its client state
STEP_KEY = "iotune_step"


def save_checkpoint(
    engine: Any, ck: dict[str, Any], global_step: int, step: int, events: _Events, acc: Any
) -> None:
    """DeepSpeed's save_checkpoint into ck["dir"], tagged by the step: the seconds the step
    was blocked, the seconds until its files were durable (fsync'd; for the decoupled writer
    after its process committed them), and what it holds; its event ends its own interval in
    the trace, after the step's."""
    tag = str(ck["tag"]).format(global_step)
    acc.synchronize()
    t0 = time.perf_counter()
    engine.save_checkpoint(ck["dir"], tag=tag, client_state={STEP_KEY: global_step})
    acc.synchronize()
    t1 = time.perf_counter()
    if ck["writer"] == "decoupled":
        engine._commit_decoupled_checkpoint()
    held = _fsync_tree(Path(ck["dir"]) / tag)
    t2 = time.perf_counter()
    events.emit(
        {
            "event": "checkpoint",
            "step": step,
            "global_step": global_step,
            "tag": tag,
            "writer": ck["writer"],
            "blocked_s": round(t1 - t0, 4),
            "durable_s": round(t2 - t0, 4),
            **held,
        }
    )


def _fsync_tree(path: Path) -> dict[str, int]:
    """fsync every file under *path* and the folders: what the save left durable, and how
    many bytes: the .pt files the writer wrote, the copy of the swap files beside them."""
    files = copied = written = 0
    for root, dirs, names in os.walk(path):
        for n in names:
            f = os.path.join(root, n)
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            files += 1
            written += size
            if n.endswith(".swp"):
                copied += size
        for d in (root, *(os.path.join(root, x) for x in dirs)):
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    return {"files": files, "bytes": written, "swap_copy_bytes": copied}
