"""Step boundaries of a training script iotune did not start, found in DeepSpeed's swap
folder without changing the script, by counting the writes of its state files.

DeepSpeed opens a swap file for every read or write and closes it when that I/O has
completed (csrc/aio/py_lib/deepspeed_py_io_handle.cpp: ``open_file`` per op, ``close`` in
``wait``), so the kernel's inotify reports each finished write of a file as one
IN_CLOSE_WRITE, in order, however long the pauses between them. The files counted are the
optimizer state (``{nvme_path}/zero_stage_3/optimizer/rank{r}/{id}.tensor.swp``), or, with
only the parameters on NVMe, the parameter files (``.../{dtype}params/rank{r}/
{id}_param.tensor.swp``); gradient files, written during backward, are not.

A *round* writes every state file of a rank once (runtime/zero/stage3.py):

- initialisation has two: ``_create_fp32_partitions`` writes each sub-group's fp32 master,
  and ``initialize_optimizer_states`` swaps each in and out again (the I/O model's 4N read
  and 8N written); with only parameters on NVMe, zero.Init writes each partition and
  ``initialize_optimizer_states`` writes it again;
- each optimizer step is one: it swaps every sub-group in and out, and the first step also
  creates the Adam moments' files (3 files a sub-group from then on; the moments come in a
  second batch of writes after the master's, swap_tensor/partitioned_optimizer_swapper.py
  ``swap_out_optimizer_state``), which is why the number of files the first step ends with
  comes from the I/O model, not from what has appeared so far.

A round ends at the write that leaves every file of the rank rewritten (and, for the first
round after initialisation, the model's number of files present). The first round's files
are not known in advance: it ends when a file is written a second time, which is the first
write of the second, and the same rule ends any round whose files differ from the model's
(a late cut, counted). Nothing here depends on how long anything takes.

Each end of initialisation and of a step is appended to the tracer's events file as the
training worker would write it (``{"event": "init"|"step", "step": n}``), the moment the
last write of the round has closed, and the tracer is woken to sample at once (not at its
next poll), so it cuts its per-step figures there. The script is not held meanwhile: I/O of
its next step that starts before the sample (none before the next backward's gradients,
with the optimizer state alone on NVMe) counts in the step before.
"""

from __future__ import annotations

import json
import os
import select
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from iotune.errors import UsageError
from iotune.trace.wake import (
    IN_CLOSE_WRITE,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_IGNORED,
    IN_ISDIR,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_OPEN,
    IN_Q_OVERFLOW,
    Inotify,
)

#: IN_OPEN is asked for, not used: the kernel merges an event with the unread one before it
#: when both are the same (fs/notify/inotify/inotify_fsnotify.c), so two writes of one file
#: in a row (initialisation's two rounds of one sub-group) would read as one; an open between
#: the two closes keeps them apart
WATCH_MASK = (
    IN_CLOSE_WRITE | IN_OPEN | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF
)

#: rounds of writes of every state file inside deepspeed.initialize (module docstring)
INIT_ROUNDS = 2
#: files a sub-group's optimizer state has after the first step: the fp32 master and Adam's
#: two moments (the I/O model's 12 bytes per parameter)
ADAM_FILES = 3


def is_state_file(name: str) -> bool:
    return name.endswith(".tensor.swp") and "_gradient_" not in name


def state_files(nvme_path: Path) -> dict[str, int]:
    """The files a step rewrites, with their sizes: optimizer state where there is any,
    else parameter files. Gradient files (written during backward) are not counted."""
    root = nvme_path / "zero_stage_3"
    opt: dict[str, int] = {}
    par: dict[str, int] = {}
    for kind in _entries(root, dirs=True):
        into = opt if kind.name == "optimizer" else par if kind.name.endswith("params") else None
        if into is None:
            continue
        for rank in _entries(Path(kind.path), dirs=True):
            for f in _entries(Path(rank.path), dirs=False):
                if is_state_file(f.name):
                    try:
                        into[f.path] = f.stat().st_size
                    except OSError:
                        continue  # removed meanwhile
    return opt or par


def _entries(path: Path, *, dirs: bool) -> list[os.DirEntry[str]]:
    try:
        return [e for e in os.scandir(path) if (e.is_dir() if dirs else e.is_file())]
    except OSError:
        return []


@dataclass
class Rank:
    """One rank's state files in one folder, and the rounds of writes they have had."""

    files_per_group: int
    writes: dict[str, int] = field(default_factory=dict)  # writes seen in this run
    base: dict[str, int] = field(default_factory=dict)  # writes at the last round's end
    pending: set[str] = field(default_factory=set)  # created, first write not closed yet
    rounds: int = 0
    groups: int | None = None  # sub-groups, known once the first round has ended
    late: int = 0  # rounds ended by a file written twice in them

    def created(self, name: str) -> None:
        if self.writes.get(name):
            return  # counted already (found in a folder that was new when watched)
        self.writes[name] = 0
        self.pending.add(name)

    def removed(self, name: str) -> None:
        for d in (self.writes, self.base):
            d.pop(name, None)
        self.pending.discard(name)

    def _live(self) -> list[str]:
        return [f for f, n in self.writes.items() if n or f in self.pending]

    def _end_round(self) -> None:
        self.rounds += 1
        if self.groups is None:
            self.groups = len(self._live())
        self.base = dict(self.writes)

    def written(self, name: str) -> int:
        """Count one finished write of *name*; the rounds this write ended (0, 1 or 2)."""
        ended = 0
        if self.writes.get(name, 0) > self.base.get(name, 0):
            # written twice within one round: that round had ended at its last write
            if self.rounds and self.groups is not None:
                self.late += 1
            self._end_round()
            ended += 1
        self.writes[name] = self.writes.get(name, 0) + 1
        self.pending.discard(name)
        if self._complete():
            self._end_round()
            ended += 1
        return ended

    def _complete(self) -> bool:
        live = self._live()
        if self.groups is None or self.pending:
            return False
        if any(self.writes[f] <= self.base.get(f, 0) for f in live):
            return False
        if self.rounds == INIT_ROUNDS:
            # the first step: it ends with every sub-group's state files present
            return len(live) >= self.groups * self.files_per_group
        return True


class StepWatch:
    """A thread that appends init and step events to *events* as the swap folder shows them.

    The watches are in place when the ``with`` block's body starts, and the events queued
    by then are all read when it ends."""

    def __init__(
        self,
        nvme_path: Path,
        events: Path,
        *,
        optimizer: bool = True,
        ranks: int = 1,
        on_event: Callable[[], None] | None = None,
    ) -> None:
        self.nvme_path = Path(os.path.abspath(nvme_path))
        self.events = events
        #: called after each event is written: the tracer samples at once, not at its poll
        self.on_event = on_event
        #: the files counted: optimizer state where it is on NVMe, else parameter files
        self.kind = "optimizer" if optimizer else "params"
        self.ranks = ranks
        self.steps = 0
        self.inited = False
        self.overflowed = False
        self._ranks: dict[Path, Rank] = {}
        self._dirs: dict[int, Path] = {}
        self._ino = Inotify()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="iotune-stepwatch", daemon=True)

    @property
    def late_cuts(self) -> int:
        return sum(r.late for r in self._ranks.values())

    def __enter__(self) -> StepWatch:
        if self.kind == "optimizer":
            # DeepSpeed makes these itself and keeps what is there (optimizer_utils.py,
            # makedirs(exist_ok=True)): made here, they are watched before its first write,
            # however soon that comes
            for r in range(self.ranks):
                folder = self.nvme_path / "zero_stage_3" / "optimizer" / f"rank{r}"
                try:
                    folder.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise UsageError(
                        f"cannot make DeepSpeed's swap folder {folder}: {exc.strerror}",
                        hint="check the config's nvme_path: it must be a writable folder",
                    ) from exc
        self._watch_tree(self._nearest(), new=False)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.flush()  # what the last writes queued
        self._ino.close()

    def flush(self) -> None:
        """Handle every event queued so far (the kernel queues one as the write's file is
        closed, so after a write has returned, its event is handled here)."""
        with self._lock:
            self._handle(self._ino.read(0))

    # ------------------------------------------------------------------ the folders

    def _nearest(self) -> Path:
        """The swap folder, or its nearest existing ancestor (DeepSpeed makes the rest)."""
        p = self.nvme_path
        while not p.is_dir() and p != p.parent:
            p = p.parent
        return p

    def _wanted(self, d: Path) -> bool:
        """A folder on the way to the swap folder, or within its three levels of state."""
        try:
            rel = d.relative_to(self.nvme_path)
        except ValueError:
            return self.nvme_path.is_relative_to(d)
        return len(rel.parts) <= 3 and (not rel.parts or rel.parts[0] == "zero_stage_3")

    def _rank(self, d: Path) -> Rank | None:
        rel = d.relative_to(self.nvme_path) if d.is_relative_to(self.nvme_path) else None
        if rel is None or len(rel.parts) != 3 or not rel.parts[2].startswith("rank"):
            return None
        kind = "optimizer" if rel.parts[1] == "optimizer" else "params"
        if kind != self.kind or (kind == "params" and not rel.parts[1].endswith("params")):
            return None
        if d not in self._ranks:
            self._ranks[d] = Rank(ADAM_FILES if kind == "optimizer" else 1)
        return self._ranks[d]

    def _watch_tree(self, d: Path, *, new: bool) -> None:
        """Watch *d* and the wanted folders under it. In a folder made after the watch
        began, the files already there were written once before it could be watched; in
        one that was there before, they are an earlier run's and count for nothing."""
        if not self._wanted(d):
            return
        wd = self._ino.add(d, WATCH_MASK)
        if wd is None:
            return
        self._dirs[wd] = d
        rank = self._rank(d)
        for e in _entries(d, dirs=True):
            self._watch_tree(Path(e.path), new=new)
        if rank is not None and new:
            for e in _entries(d, dirs=False):
                if is_state_file(e.name) and e.name not in rank.writes:
                    rank.created(e.name)
                    self._ended(rank.written(e.name))

    # ------------------------------------------------------------------ the events

    def _loop(self) -> None:
        while not self._stop.is_set():
            select.select([self._ino.fd], [], [], 0.1)
            self.flush()

    def _handle(self, events: list[tuple[int, int, str]]) -> None:
        for wd, mask, name in events:
            if mask & IN_Q_OVERFLOW:
                self.overflowed = True
                continue
            d = self._dirs.get(wd)
            if d is None:
                continue
            if mask & (IN_IGNORED | IN_DELETE_SELF):
                self._dirs.pop(wd, None)
                self._ranks.pop(d, None)
                continue
            path = d / name
            if mask & IN_ISDIR:
                if mask & (IN_CREATE | IN_MOVED_TO):
                    self._watch_tree(path, new=True)
                continue
            rank = self._rank(d)
            if rank is None or not is_state_file(name):
                continue
            if mask & (IN_DELETE | IN_MOVED_FROM):
                rank.removed(name)
            elif mask & (IN_CREATE | IN_MOVED_TO):
                rank.created(name)
            elif mask & IN_CLOSE_WRITE:
                self._ended(rank.written(name))

    def _ended(self, rounds: int) -> None:
        # the ranks writing in this run (an earlier run's folders may be there too); one whose
        # folder is not there yet has not ended any round
        active = [r for r in self._ranks.values() if r.pending or any(r.writes.values())]
        if not rounds or len(active) < self.ranks:
            return
        done = min(r.rounds for r in active)
        while not self.inited and done >= INIT_ROUNDS:
            self.inited = True
            self._emit("init", 0)
        while self.inited and done - INIT_ROUNDS > self.steps:
            self.steps += 1
            self._emit("step", self.steps)

    def _emit(self, event: str, step: int) -> None:
        line = json.dumps({"event": event, "step": step, "source": "swap folder"}) + "\n"
        fd = os.open(self.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        if self.on_event is not None:
            self.on_event()
