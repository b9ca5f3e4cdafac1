"""Step boundaries of a training script iotune did not start, found in DeepSpeed's swap
folder without changing the script. Every optimizer step rewrites every optimizer-state file
(``{nvme_path}/zero_stage_3/optimizer/rank{r}/{id}.tensor.swp``: the fp32 master and the Adam
moments, swap_tensor/optimizer_utils.py), or, with only the parameters on NVMe, every
parameter file (``.../{dtype}params/rank{r}/{id}_param.tensor.swp``) once the step has
updated them. A step has ended when every such file has been rewritten since the last end
and none has been written for a moment (DeepSpeed swaps a step's sub-groups out back to
back); the first such end is initialisation's (deepspeed.initialize writes the fp32 master).

Each end is appended to the tracer's events file as the training worker would write it
(``{"event": "init"|"step", "step": n}``), so the tracer cuts its per-step figures there.
The cut falls on the poll after the last write: I/O of the next step that starts within
that moment (parameter reads of its forward) is counted in the step before.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

#: seconds without a state-file write that end a step
QUIET_S = 0.15
POLL_S = 0.05


def state_files(nvme_path: Path) -> dict[str, int]:
    """The files a step rewrites, with their mtimes (ns): optimizer state where there is
    any, else parameter files. Gradient files (written during backward) are not counted."""
    root = nvme_path / "zero_stage_3"
    opt: dict[str, int] = {}
    par: dict[str, int] = {}
    try:
        kinds = list(os.scandir(root))
    except OSError:
        return {}
    for kind in kinds:
        if not kind.is_dir():
            continue
        into = opt if kind.name == "optimizer" else par if kind.name.endswith("params") else None
        if into is None:
            continue
        for rank in _dirs(kind.path):
            for f in _files(rank):
                if f.name.endswith(".tensor.swp") and "_gradient_" not in f.name:
                    try:
                        into[f.path] = f.stat().st_mtime_ns
                    except OSError:
                        continue  # removed meanwhile
    return opt or par


def _dirs(path: str) -> list[str]:
    try:
        return [e.path for e in os.scandir(path) if e.is_dir()]
    except OSError:
        return []


def _files(path: str) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(path) if e.is_file()]
    except OSError:
        return []


class StepWatch:
    """A thread that appends init and step events to *events* as the swap folder shows them."""

    def __init__(self, nvme_path: Path, events: Path) -> None:
        self.nvme_path = nvme_path
        self.events = events
        self.steps = 0
        self.inited = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="iotune-stepwatch", daemon=True)

    def __enter__(self) -> StepWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _emit(self, event: str, step: int) -> None:
        line = json.dumps({"event": event, "step": step, "source": "swap folder"}) + "\n"
        fd = os.open(self.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def _loop(self) -> None:
        since = time.time_ns()  # the last end: files written after it count for the next
        last_write = 0
        while not self._stop.wait(POLL_S):
            files = state_files(self.nvme_path)
            if not files:
                continue
            newest = max(files.values())
            last_write = max(last_write, newest)
            quiet = time.time_ns() - last_write >= QUIET_S * 1e9
            if quiet and all(m > since for m in files.values()):
                since = newest
                if not self.inited:
                    self.inited = True
                    self._emit("init", 0)
                else:
                    self.steps += 1
                    self._emit("step", self.steps)
