"""Step events the tracer acknowledges (iotune/trace/acks.py), with a real FIFO between a
real worker process and the tracer's side."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from iotune.trace.acks import ACK_ENV, LOCAL_RANKS, AckSender, AckWaiter
from iotune.workers.train import Events

#: a worker: two events, each written to the events file and waited for
WORKER = """
import sys
from pathlib import Path
from iotune.workers.train import Events
ev = Events(Path(sys.argv[1]), 0, "node")
for step in (1, 2):
    ev.emit({"event": "step", "step": step})
    print(f"after {step}", flush=True)
"""


def _first_event(events: Path, p: subprocess.Popen[str]) -> None:
    """Until the worker has written its first event (it starts in a second or so)."""
    deadline = time.monotonic() + 60
    while not (events.exists() and events.read_text().endswith("\n")):
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "the worker wrote no event"
        time.sleep(0.02)


def _waiting_worker(
    run_dir: Path, events: Path, acks: AckSender, rank: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """WORKER traced with *acks* (a rank of a multi-rank run with *rank*'s environment),
    once it has written its first event."""
    p = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(run_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "IOTUNE_EVENTS": str(events), **acks.env(), **(rank or {})},
    )
    try:
        _first_event(events, p)
    except BaseException:
        p.kill()
        p.wait()
        raise
    return p


def _line(p: subprocess.Popen[str], seconds: float) -> str | None:
    """The worker's next line of output, or None if it wrote none in *seconds*."""
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], seconds)
    return p.stdout.readline().strip() if ready else None


def test_a_worker_goes_on_after_each_event_only_once_it_is_acknowledged(tmp_path: Path) -> None:
    acks = AckSender()
    events = tmp_path / "events.jsonl"
    p = _waiting_worker(tmp_path, events, acks)
    try:
        # the first event is written, and the worker waits: nothing follows it
        assert _line(p, 1.0) is None
        assert [json.loads(x)["step"] for x in events.read_text().splitlines()] == [1]
        acks.ack()
        assert _line(p, 30) == "after 1"
        assert _line(p, 1.0) is None  # the second event waits for its own
        acks.ack(True)  # a workload's "ack": true (docs/commands/trace.md): local rank 0
        assert _line(p, 30) == "after 2"
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.wait()
        acks.close()
    # the tracer's copy asks for the acknowledgement; the run's own record does not
    traced = [json.loads(x) for x in events.read_text().splitlines()]
    kept = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [e.get("ack") for e in traced] == [0, 0]  # local rank 0's FIFO
    assert all("ack" not in e for e in kept)
    assert [{k: v for k, v in e.items() if k != "ack"} for e in traced] == kept
    assert not acks.path.exists() and not acks.path.parent.exists()


def test_each_rank_waits_for_its_own_acknowledgement(tmp_path: Path) -> None:
    """Two ranks of one run, each with a FIFO of its own: the tracer's acknowledgement of one
    rank's event lets that rank go on, never the other, whichever reads first."""
    acks = AckSender()
    for r in (0, 1):
        (tmp_path / str(r)).mkdir()
    ranks = [
        _waiting_worker(
            tmp_path / str(r),
            tmp_path / f"events{r}.jsonl",
            acks,
            {"WORLD_SIZE": "2", "RANK": str(r), "LOCAL_RANK": str(r)},
        )
        for r in (0, 1)
    ]
    try:
        assert [_line(p, 1.0) for p in ranks] == [None, None]  # both wait
        acks.ack(1)
        assert _line(ranks[1], 30) == "after 1"
        assert _line(ranks[0], 1.0) is None  # rank 0's event is not acknowledged yet
        acks.ack(0)
        assert _line(ranks[0], 30) == "after 1"
        for r, p in enumerate(ranks):
            acks.ack(r)
            assert _line(p, 30) == "after 2" and p.wait(timeout=30) == 0
    finally:
        for p in ranks:
            p.kill()
            p.wait()
        acks.close()
    for r in (0, 1):
        traced = [json.loads(x) for x in (tmp_path / f"events{r}.jsonl").read_text().splitlines()]
        assert [e["ack"] for e in traced] == [r, r]  # each marked with its FIFO


def test_a_worker_whose_tracer_is_gone_stops_waiting(tmp_path: Path) -> None:
    acks = AckSender()
    events = tmp_path / "events.jsonl"
    p = _waiting_worker(tmp_path, events, acks)
    try:
        assert _line(p, 1.0) is None  # waiting
        acks.close()  # the write end closed: the worker reads the end of the file
        assert _line(p, 30) == "after 1"
        assert _line(p, 30) == "after 2"
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.wait()
    # the second event asks for nothing: the worker no longer waits
    assert [json.loads(x).get("ack") for x in events.read_text().splitlines()] == [0, None]


def test_a_worker_that_opens_the_fifo_after_its_tracer_has_gone_does_not_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The FIFO still there, its writer gone (a tracer killed with SIGKILL leaves it)."""
    fifo = tmp_path / "ack"
    os.mkfifo(fifo)
    os.close(os.open(fifo, os.O_RDWR))  # a writer came and went
    monkeypatch.setenv(ACK_ENV, str(fifo))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    waiter = AckWaiter.from_env()
    assert waiter is not None and waiter.active
    started = time.monotonic()
    waiter.wait()
    assert not waiter.active and time.monotonic() - started < 5


def test_a_killed_tracers_fifo_folder_is_removed_by_the_next_tracer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL leaves the tracer no chance to remove its FIFO's folder: the next tracer on
    the host removes it, and keeps the folder of a tracer that is still running."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    code = "from iotune.trace.acks import AckSender; print(AckSender().path, flush=True); input()"
    killed, running = (
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    )
    try:
        paths = [Path(_line(p, 60) or "") for p in (killed, running)]
        assert all(p.exists() for p in paths), paths
        killed.kill()
        killed.wait()
        acks = AckSender()
        try:
            assert not paths[0].parent.exists()  # the killed tracer's
            assert paths[1].exists()  # the running tracer's
            assert acks.path.parent.name.startswith(f"iotune-ack-{os.getpid()}-")
        finally:
            acks.close()
    finally:
        for p in (killed, running):
            p.kill()
            p.wait()


@pytest.mark.parametrize("local_rank", [str(LOCAL_RANKS), None])
def test_who_does_not_wait(
    local_rank: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank beyond the FIFOs (LOCAL_RANKS of them), and a worker traced without
    acknowledgements: each event is written and the worker goes on."""
    acks = AckSender()
    try:
        monkeypatch.setenv("IOTUNE_EVENTS", str(tmp_path / "events.jsonl"))
        if local_rank is None:
            monkeypatch.delenv(ACK_ENV, raising=False)
        else:
            monkeypatch.setenv(ACK_ENV, str(acks.path))
            monkeypatch.setenv("WORLD_SIZE", str(LOCAL_RANKS + 1))
            monkeypatch.setenv("LOCAL_RANK", local_rank)
        assert AckWaiter.from_env() is None
        Events(tmp_path, 0, "node").emit({"event": "step", "step": 1})  # nothing acknowledges it
        (line,) = (tmp_path / "events.jsonl").read_text().splitlines()
        assert "ack" not in json.loads(line)
    finally:
        acks.close()
