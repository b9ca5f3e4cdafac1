"""The study's second volume, in the lab's guest (tests/vm/checkpoint_lab.py): checkpoints of a
ZeRO-3 run that offloads to a RAID0 of four, saved to a RAID6 of four built by `iotune raid
create`, traced on both arrays' members by the real eBPF program: by DeepSpeed's copytree, by
iotune's aio copy, and as snapshots on the RAID0 persisted to the RAID6 beside the training.
Each save's copy is the I/O model's to the byte; the RAID6's members write what full stripes
make of it (K/(K-2) = 2); a member failed while a persist copies leaves that save whole and
loadable, and a run resumed from it trains on as the saving run did."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.vm.checkpoint_lab import CK_STEPS, FAILED_SAVE, PERSISTED, WRITERS, CheckpointRuns
from tests.vm.study_lab import CK_OFFLOAD, VOLUMES, Lab

KIB, MIB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def saving(checkpoint_runs: CheckpointRuns) -> dict[str, Any]:
    doc = checkpoint_runs.saving
    assert doc["steps_done"] == CK_STEPS, doc.get("error")
    return doc


def _saves(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {s["step"]: s for s in doc["checkpoints"]["saves"]}


def test_the_checkpoints_raid6_is_built_as_asked(checkpoint_runs: CheckpointRuns) -> None:
    """`iotune raid create --level 6` over four drives (the lab's set-up): md's geometry and
    the file system laid on it, as `raid status` reads them back."""
    a = checkpoint_runs.built
    assert a["device"] == "/dev/md/ckpt" and len(a["members"]) == 4, a
    assert (a["level"], a["chunk_bytes"], a["fs"]) == ("raid6", 512 * KIB, "xfs"), a
    assert a["minimum_io_size"] == 512 * KIB and a["optimal_io_size"] == 2 * 512 * KIB, a
    assert a["state"] in ("clean", "active", "active-idle"), a


def test_each_save_is_a_snapshot_on_the_raid0_persisted_whole_to_the_raid6(
    checkpoint_runs: CheckpointRuns, saving: dict[str, Any], lab: Lab
) -> None:
    """--checkpoint-copy reflink --checkpoint-persist: each save clones the swap files on the
    RAID0 the run swaps to (no data read there: the clone), and its persist copies the whole
    tag folder to the RAID6, the bytes the guest counts there after the run; the persist
    volume is traced apart, and its members wrote at least that."""
    n_s = saving["estimate"]["swapped"]["n_s"]
    ck = saving["checkpoints"]
    raid0 = sorted(lab.names[s] for s in VOLUMES[CK_OFFLOAD])
    assert ck["copy"] == "reflink"
    assert sorted(ck["offload_drives"]) == raid0 == sorted(ck["checkpoint_drives"]), ck
    assert len(ck["persist_drives"]) == 4 and not set(ck["persist_drives"]) & set(raid0), ck
    saves = _saves(saving)
    assert sorted(saves) == list(range(1, CK_STEPS + 1))
    for s in saves.values():
        assert s["swap_copy_bytes"] == 12 * n_s
        assert [r["copy"] for r in s["swap_copy"]] == ["reflink"], s["swap_copy"]
        assert s["offload_read_bytes"] < 12 * n_s // 4, s  # a clone reads no data
        assert 0 < s["blocked_s"] <= s["durable_s"]
        p = s["persist"]
        assert p["bytes"] == s["bytes"] == checkpoint_runs.persisted_bytes[s["tag"]], (p, s)
        assert p["write_bytes"] >= p["bytes"], p


def _full_stripes(p: dict[str, Any] | None, saved: int, seconds: float, files: int) -> None:
    """A save (or a persist) of *saved* bytes in *files* files, *seconds* long, on the healthy
    array: the members wrote twice its bytes (two of four members hold data). What they read
    back is the files' last, partial stripes (a save is a dozen files; each ends inside a
    stripe md completes by reading): a few stripes, not the save's worth, and each member's
    share within a chunk or two of the others'."""
    assert p is not None
    assert (p["level"], p["members"], p["ideal"]) == ("raid6", 4, 2.0)
    stripe = p["stripe_bytes"]
    assert stripe == 2 * p["chunk_bytes"]
    assert p["saved_bytes"] == saved and p["amplification"] >= 2.0, p
    # what the array itself was asked (its diskstats): the save's files, xfs's log and
    # metadata. The members wrote between the full-stripe ideal of that and each page on its
    # own (the page, P and Q: 3x). Where in between depends on how writeback cut the files
    # (2.07x to 2.39x of the save's bytes seen on the lab's 22 MB saves). Beyond it: md's
    # superblock, written to each member as the array turns dirty and, 200 ms idle, clean
    # again (a 4 KiB block each time)
    asked = p["array_write_bytes"]
    assert asked >= saved, p
    turns = 2 * (math.ceil(seconds / 0.2) + 1)
    superblocks = turns * p["members"] * 4 * KIB
    assert 2 * saved <= p["member_write_bytes"] <= 3 * asked + superblocks, (p, saved)
    # at most a stripe read back for each file's tail (and xfs's few metadata blocks): a
    # save of a dozen files reads back a few stripes, whatever its size (1.3 and 3.1 MiB seen
    # on the lab's 22 MB saves, whose share of the save says nothing)
    assert p["member_read_bytes"] <= (files + 4) * stripe, (files, p)
    written = [m["write"] for m in p["per_member"].values()]
    # parity rotates: each member holds a quarter of the full stripes' chunks, data and
    # parity; what the members wrote beyond the full-stripe ideal (the files' last partial
    # stripes, xfs's log and metadata) lands on the members those stripes are on (1.84 MB
    # apart seen, on a volume that held two earlier saves)
    assert max(written) - min(written) <= 2 * p["chunk_bytes"] + p["excess_bytes"], p


def _save_stripes(s: dict[str, Any]) -> None:
    _full_stripes(s["parity"], s["bytes"], s["durable_s"], s["files"])


def test_a_healthy_raid6_writes_full_stripes_of_a_persist(saving: dict[str, Any]) -> None:
    """The persist before the failure: its aio copy's writes, from its save's end to the
    wait for it, full stripes on the RAID6."""
    p = _saves(saving)[1]["persist"]
    _full_stripes(p["parity"], p["bytes"], p["seconds"], p["files"])


@pytest.mark.parametrize("writer", WRITERS)
def test_each_fastpersist_writer_saves_the_same_bytes_in_full_stripes(
    checkpoint_runs: CheckpointRuns, saving: dict[str, Any], writer: str
) -> None:
    """Each of DeepSpeed's FastPersist writers on the guest's CPU, each with a copy of the
    swap files (iotune's aio copy; DeepSpeed's copytree): the same copy of the optimizer
    state and the same files as torch.save's, traced on both arrays, the RAID6's members
    writing full stripes of them."""
    doc = checkpoint_runs.writers[writer]
    assert doc["steps_done"] == 1, doc.get("error")
    # the decoupled engine's process forked from the worker, not spawned (no GPU here)
    forked = any("forked from the training worker" in n for n in doc.get("notes", []))
    assert forked == (writer == "decoupled"), doc.get("notes")
    ck = doc["checkpoints"]
    assert ck["writer"] == writer and ck["copy"] == WRITERS[writer]
    assert len(ck["offload_drives"]) == len(VOLUMES[CK_OFFLOAD])
    assert len(ck["checkpoint_drives"]) == 4
    (s,) = ck["saves"]
    n_s = doc["estimate"]["swapped"]["n_s"]
    assert s["swap_copy_bytes"] == 12 * n_s
    # iotune's copy records each folder it copied; DeepSpeed's copytree none
    copied = [(r["copy"], r["bytes"]) for r in s["swap_copy"]]
    assert copied == ([("aio", 12 * n_s)] if WRITERS[writer] == "aio" else []), copied
    # the writer's zip records are named "archive/..." where torch.save names them by file
    # (4,376 and 4,504 bytes fewer seen in the root tier); the saving run's saves are
    # torch.save's, as snapshots
    assert 0 < _saves(saving)[1]["bytes"] - s["bytes"] <= 8 * KIB, (s, _saves(saving)[1])
    assert 12 * n_s <= s["offload_read_bytes"] <= 12 * n_s + 64 * KIB, s
    assert 0 < s["blocked_s"] <= s["durable_s"]
    _save_stripes(s)


def test_a_member_failed_during_a_persist_leaves_it_whole(
    checkpoint_runs: CheckpointRuns, saving: dict[str, Any]
) -> None:
    """The member failed while the persist of save FAILED_SAVE was copying (its process held
    still, its first file in the persist folder, latest still naming the save before): the
    copy went on, on the degraded array, to the whole save; the save after it was persisted
    with that member taking none of its writes."""
    f = checkpoint_runs.failure
    assert f["fail_rc"] == 0, f["fail_stderr"]
    assert f["during_persist"] is True and f["latest_then"] == f"step{FAILED_SAVE - 1}", f
    assert f["files_then"] >= 1, f
    saves = _saves(saving)
    s = saves[FAILED_SAVE]
    p = s["persist"]
    assert p["bytes"] == s["bytes"] == checkpoint_runs.persisted_bytes[s["tag"]], (p, s)
    lost = checkpoint_runs.member
    parity = p["parity"]
    assert parity is not None
    # from the failure on the member takes no more writes: it wrote less than the others
    others = [m["write"] for n, m in parity["per_member"].items() if n != lost]
    assert parity["per_member"][lost]["write"] < min(others), parity["per_member"]
    after = saves[FAILED_SAVE + 1]["persist"]["parity"]
    assert after is not None and after["per_member"][lost]["write"] == 0, after["per_member"]
    (arr,) = checkpoint_runs.status["arrays"]
    states = {m["device"]: m["state"] for m in arr["members"]}
    assert "faulty" in states[f"/dev/{lost}"], states
    assert sum("in_sync" in (v or "") for v in states.values()) == 3, states


def test_a_run_resumed_from_the_degraded_array_trains_on(
    checkpoint_runs: CheckpointRuns, saving: dict[str, Any]
) -> None:
    """The persisted save made while the member failed loads, its swap files copied back
    by the aio copy from the degraded RAID6, and the next step's loss is the saving run's."""
    resumed = checkpoint_runs.resumed
    assert resumed["resumed_at"] == FAILED_SAVE, resumed.get("error")
    (step,) = [e for e in resumed["events"] if e["event"] == "step"]
    assert step["global_step"] == FAILED_SAVE + 1
    want = next(
        e["loss"] for e in saving["events"] if e["event"] == "step" and e["step"] == FAILED_SAVE + 1
    )
    assert math.isclose(step["loss"], want, rel_tol=1e-4), (step["loss"], want)
    # iotune's own check of it, against the losses the saving run kept beside its tags
    check = resumed["resume_check"]
    assert check["ok"] is True and check["at_step"] == FAILED_SAVE + 1, check
    init = next(e for e in resumed["events"] if e["event"] == "init")
    (rec,) = init["resume_copy"]
    assert rec["copy"] == "aio", rec
    assert rec["source"] == f"{PERSISTED}/step{FAILED_SAVE}/offloaded_tensors/rank00", rec


def test_two_ranks_save_once_and_the_raid6_writes_full_stripes_of_it(
    checkpoint_runs: CheckpointRuns, lab: Lab
) -> None:
    """`--ranks 2` x checkpoints x the RAID6: each rank's save event sees the whole tag folder
    (DeepSpeed's save ends in a barrier), and the run counts that folder once, so the
    parity measured against it is RAID6's, not half of it."""
    doc = checkpoint_runs.ranks
    assert doc["ranks"] == 2 and doc["steps_done"] == 1, doc.get("error")
    ck = doc["checkpoints"]
    assert sorted(ck["offload_drives"]) == sorted(lab.names[s] for s in VOLUMES[CK_OFFLOAD])
    assert len(ck["checkpoint_drives"]) == 4
    (s,) = ck["saves"]
    # the tag folder's files, summed in the guest: the save, once
    assert s["bytes"] == checkpoint_runs.ranks_tag_bytes, s
    # both ranks' copies of their swap files, the two-rank model's to the byte
    n_s = doc["estimate"]["swapped"]["n_s"]
    assert s["swap_copy_bytes"] == 2 * 12 * n_s == ck["estimate"]["write_bytes"], s
    _save_stripes(s)
