"""The trace loop's sleep (iotune/trace/wake.py): woken by what it watches, at once, and by
nothing else before its time. Each wait that should be woken is given a minute: it returning
well before then is the wake (a minute is a hang detector, not a measure)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from iotune.trace.wake import POLL_S, Wake

MINUTE = 60.0
#: a whole sleep of 0.3 s as this clock may read it (select can end a hair early)
WHOLE = 0.29


def _took(w: Wake, timeout: float) -> float:
    t0 = time.monotonic()
    w.wait(timeout)
    return time.monotonic() - t0


def test_a_write_to_the_events_file_wakes_it_and_nothing_else_does(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    w = Wake()
    w.watch(events)
    try:
        assert w.woken_by_kernel
        assert _took(w, 0.3) >= WHOLE  # nothing written: it sleeps its whole time
        with events.open("a") as fh:
            fh.write('{"event": "step", "step": 1}\n')
        assert _took(w, MINUTE) < MINUTE / 2
        # what woke it was read: the next sleep is whole again
        assert _took(w, 0.3) >= WHOLE
        (tmp_path / "samples.jsonl").write_text("{}\n")  # another file of the folder
        assert _took(w, 0.3) >= WHOLE
    finally:
        w.close()


def test_a_thread_that_sets_it_wakes_it(tmp_path: Path) -> None:
    w = Wake()
    try:
        threading.Timer(0.1, w.set).start()
        assert _took(w, MINUTE) < MINUTE / 2
        assert _took(w, 0.3) >= WHOLE
        for _ in range(100_000):  # more than a pipe holds: set() never blocks nor raises
            w.set()
        assert _took(w, MINUTE) < MINUTE / 2
        assert _took(w, 0.3) >= WHOLE
    finally:
        w.close()


def test_the_workloads_end_wakes_it() -> None:
    w = Wake()
    child = subprocess.Popen(["sleep", "0.2"])
    try:
        w.child(child.pid)
        assert w.woken_by_kernel
        assert _took(w, MINUTE) < MINUTE / 2
        assert child.wait(timeout=MINUTE) == 0
    finally:
        w.close()


def test_where_the_file_cannot_be_watched_it_looks_every_poll(tmp_path: Path) -> None:
    w = Wake()
    try:
        w.watch(tmp_path / "gone.jsonl")
        assert not w.woken_by_kernel
        assert POLL_S <= _took(w, MINUTE) < MINUTE / 2
    finally:
        w.close()
