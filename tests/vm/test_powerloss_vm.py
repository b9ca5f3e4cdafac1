"""Power lost while a save is persisted (tests/vm/powerloss_lab.py): every write of two
persists (iotune.workers.persist, the copy --checkpoint-persist runs beside the training)
recorded by device-mapper's log-writes target in the lab's guest, and the volume replayed on
the host to the mark after the first and to every flush and FUA write after it, as xfstests
replays a log. At each point, the volume as XFS recovers it after a crash holds a latest
that names a whole save, file for file the one the saving run persisted; latest names the
new save only once all of it is there; and a run resumed from the last point before it did
continues the loss."""

from __future__ import annotations

import math
from typing import Any

from tests.vm.checkpoint_lab import CheckpointRuns
from tests.vm.powerloss_lab import TAGS


def test_at_every_point_power_can_be_lost_latest_names_a_whole_save(
    checkpoint_runs: CheckpointRuns,
) -> None:
    pl = checkpoint_runs.powerloss
    assert pl.mark_at < pl.entries
    seen = pl.points
    # the mark, then the flushes and FUA writes of the second save's copy and its latest
    # (each file fsynced, then its folders, then latest): many points, not a couple
    assert len(seen) >= 8, seen
    assert [p["problem"] for p in seen] == [None] * len(seen), [p for p in seen if p["problem"]]
    latest = [p["latest"] for p in seen]
    # the first save until the second is whole, then the second to the end: never back
    flip = latest.index(TAGS[1])
    assert latest == [TAGS[0]] * flip + [TAGS[1]] * (len(seen) - flip), latest
    assert all(p["second_whole"] for p in seen[flip:]), seen[flip:]
    # cut before the second save was whole (latest on the first), and cut after its copy,
    # before latest moved. Whether a point also falls midway through the copy (some files
    # there, not all) is the kernel's timing, not the copy's: the copy writes every file
    # O_DIRECT, then fsyncs them, and XFS logs the files' extents at the first fsync's log
    # force unless its own log work fell within the copy (seen on slower hosts, not on a
    # faster one): counted, not asserted
    before = seen[:flip]
    assert any(not p["second_whole"] for p in before), before
    assert before[-1]["second_whole"], before[-1]
    midway = sum(p["second_files"] > 0 and not p["second_whole"] for p in before)
    print(f"power-loss points: {len(seen)}, {flip} before latest moved, {midway} midway")
    assert pl.sources[TAGS[0]] != pl.sources[TAGS[1]]


def test_a_run_resumed_from_the_last_point_before_latest_moved_continues_the_loss(
    checkpoint_runs: CheckpointRuns,
) -> None:
    pl = checkpoint_runs.powerloss
    point = pl.resumed_point
    assert point["entry"] == max(p["entry"] for p in pl.points if p["latest"] == TAGS[0])
    doc: dict[str, Any] = pl.resumed
    assert doc["resumed_at"] == 1, doc.get("error")
    (step,) = [e for e in doc["events"] if e["event"] == "step"]
    assert step["global_step"] == 2
    saving = checkpoint_runs.saving
    want = next(e["loss"] for e in saving["events"] if e["event"] == "step" and e["step"] == 2)
    assert math.isclose(step["loss"], want, rel_tol=1e-4), (step["loss"], want)
    check = doc["resume_check"]
    assert check["ok"] is True and check["at_step"] == 2, check
