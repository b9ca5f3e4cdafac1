"""Unit: a run's checkpoints, the pure parts (the I/O model of a save, the rows of a run's
saves, the checks of --checkpoint-dir and --resume-from on plain folders)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from iotune.errors import UsageError
from iotune.model.dsconfig import ds_config
from iotune.model.estimate import estimate
from iotune.model.presets import get_preset
from iotune.train.checkpoint import (
    Checkpointing,
    check_folder,
    resume_point,
    save_rows,
    save_volume,
)
from iotune.train.request import make_request

KIB, MIB = 1 << 10, 1 << 20


def _est(name: str = "tiny_opt_nvme"):  # type: ignore[no-untyped-def]
    p = get_preset(name)
    return estimate(p, ds_config(p))


def test_a_save_moves_the_optimizer_state_once_each_way() -> None:
    e = _est("opt_nvme_16b")
    v = save_volume(e, optimizer_on_nvme=True)
    assert v.read == v.write == 12 * e.swapped.n_s
    # the study's 16B (N = 16.1e9): 12N, 180 GiB read and written by each save
    assert round(v.write / 2**30) == 180
    ram = save_volume(_est("opt_ram_1b"), optimizer_on_nvme=False)
    assert ram.read == 0 and ram.write > 0


def test_writers_map_to_deepspeeds_checkpoint_section() -> None:
    ck = Checkpointing(2, Path("/x"))
    assert ck.ds_config() is None and ck.tag(4) == "step4" and ck.saves(5) == 2
    assert Checkpointing(1, Path("/x"), "decoupled").ds_config() == {
        "writer": {"type": "fast", "decoupled": True}
    }


def test_save_rows_split_the_drives_and_stand_beside_the_model() -> None:
    e = _est()
    c = 12 * e.swapped.n_s
    events = [
        {"event": "step", "step": 1},
        {"event": "checkpoint", "step": 1, "tag": "step1", "writer": "torch", "blocked_s": 1.0}
        | {"durable_s": 2.0, "files": 5, "bytes": c + 100, "swap_copy_bytes": c},
    ]
    io: list[dict[str, Any]] = [
        {
            "label": "checkpoint:1",
            "read": {"bytes": c + 4096},
            "write": {"bytes": c + 8192},
            "drives": {"a": {"read": c, "write": 0}, "b": {"read": 4096, "write": c + 8192}},
        }
    ]
    doc = save_rows(events, io, e, True, ("a",), ("b",))
    assert doc is not None
    (row,) = doc["saves"]
    assert row["offload_read_bytes"] == c and row["checkpoint_write_bytes"] == c + 8192
    assert row["write_gib_s"] == round((c + 8192) / 2**30 / 2.0, 3)
    assert doc["estimate"] == {"bytes": c, "read_bytes": c, "write_bytes": c, "exact": True}
    assert row["offload_read_sizes"] is None  # no sizes in this interval: not traced by size
    io[0]["drives"]["a"] |= {"read_sizes": {"131072": 3, "4096": 1}, "write_sizes": {}}
    io[0]["drives"]["b"] |= {"read_sizes": {"4096": 1}, "write_sizes": {524288: 2}}
    (row,) = save_rows(events, io, e, True, ("a",), ("b",))["saves"]  # type: ignore[index]
    assert row["offload_read_sizes"] == {4096: 1, 131072: 3}
    assert row["checkpoint_write_sizes"] == {524288: 2}
    # untraced: the seconds and the files, no drive figures
    bare = save_rows(events, [], e, True, (), ())
    assert bare is not None and bare["saves"][0]["offload_read_bytes"] is None
    assert save_rows(events[:1], io, e, True, ("a",), ("b",)) is None
    # a reflink save clones the files: as big on disk, and the drives move none of it; the
    # table's estimate row says so beside the measured zeroes
    from iotune.train.render import checkpoints_table

    cloned = [events[0], events[1] | {"copy": "reflink"}]
    doc = save_rows(cloned, io, e, True, ("a",), ("a",))
    assert doc is not None and doc["copy"] == "reflink"
    assert doc["estimate"] == {"bytes": c, "read_bytes": 0, "write_bytes": 0, "exact": True}
    table = checkpoints_table({"checkpoints": doc})
    assert table is not None
    cells = {str(col.header): list(col.cells) for col in table.columns}
    gib = f"{c / 2**30:.3f}"
    assert [v[-1] for k, v in cells.items() if "GiB" in k and "/s" not in k] == [
        gib,
        "0.000",
        "0.000",
    ], cells


def test_a_folder_too_small_for_the_saves_is_refused_with_numbers(tmp_path: Path) -> None:
    ck = Checkpointing(1, tmp_path / "ck")
    with pytest.raises(UsageError, match=r"3 save\(s\) of about .* GiB free"):
        check_folder(ck, 3, [], 1 << 60, force=False)
    notes = check_folder(Checkpointing(5, tmp_path / "ck"), 3, [], 1, force=False)
    assert notes == ["--checkpoint-every 5: no save within the run's 3 step(s)"]
    with pytest.raises(UsageError, match="on the offload volume"):
        check_folder(ck, 3, [tmp_path], 1, force=False)
    assert "on the offload volume" in check_folder(ck, 3, [tmp_path], 1, force=True)[0]
    # a reflink snapshot belongs there: no --force, and the room asked is still the copy's
    (note,) = check_folder(ck, 3, [tmp_path], 1, force=False, copy="reflink")
    assert "as a reflink snapshot must be" in note
    with pytest.raises(UsageError, match="GiB free"):
        check_folder(ck, 3, [tmp_path], 1 << 60, force=False, copy="reflink")
    assert not (tmp_path / "ck").exists()


def test_resume_needs_a_save_of_this_model(tmp_path: Path) -> None:
    e = _est()
    c = 12 * e.swapped.n_s
    tag = tmp_path / "ck" / "step2"
    (tag / "offloaded_tensors" / "rank00").mkdir(parents=True)
    (tmp_path / "ck" / "latest").write_text("step2\n")
    with pytest.raises(UsageError, match="holds no DeepSpeed checkpoint"):
        resume_point(tmp_path / "ck", e, True)
    (tag / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"x")
    swp = tag / "offloaded_tensors" / "rank00" / "p.tensor.swp"
    swp.write_bytes(b"\0" * 4096)
    with pytest.raises(UsageError, match=f"its optimizer state is 4,096 bytes, this model's {c:,}"):
        resume_point(tmp_path / "ck", e, True)
    with swp.open("r+b") as fh:
        fh.truncate(c)
    assert resume_point(tmp_path / "ck", e, True) == (tmp_path / "ck", "step2")
    assert resume_point(tag, e, True) == (tmp_path / "ck", "step2")


def test_checkpoint_options_come_in_pairs(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--checkpoint-dir needs its partner"):
        make_request(
            "tiny_opt_nvme",
            *("auto", str(tmp_path / "out"), None, None, (), None, None, None, False, False),
            checkpoint_dir=str(tmp_path),
        )


def test_parity_is_measured_against_full_stripes() -> None:
    from iotune.train.parity import parity_traffic

    saved = 96 * MIB
    # RAID6 of 4, 512 KiB chunk: a full stripe holds 1 MiB of data, and 2 MiB reach the members
    full = {
        f"d{i}": {"read": 0, "write": 48 * MIB, "write_sizes": {512 * KIB: 96}} for i in range(4)
    }
    p = parity_traffic("raid6", 512 * KIB, full, saved)
    assert p is not None
    assert p["ideal"] == 2.0 and p["amplification"] == 2.0 and p["excess_bytes"] == 0
    assert p["stripe_bytes"] == MIB and not p["read_modify_write"] and p["advice"] is None
    # the same save in 256 KiB requests: each updates half a stripe, read back first
    part = {f"d{i}": {"read": 24 * MIB, "write": 64 * MIB} for i in range(4)}
    q = parity_traffic("raid6", 512 * KIB, part, saved, requests=256 * KIB)
    assert q is not None and q["read_modify_write"] and q["amplification"] > q["ideal"]
    assert q["advice"] == (
        "the writer's 256 KiB requests do not fill the 1024 KiB stripe (2 data members x "
        "512 KiB chunk): a chunk of 128 KiB, or a writer block of a multiple of 1024 KiB "
        "writes full stripes"
    )
    r5 = parity_traffic("raid5", 512 * KIB, {f"d{i}": {"read": 0, "write": 1} for i in range(5)}, 1)
    assert r5 is not None and r5["ideal"] == 1.25 and r5["stripe_bytes"] == 2 * MIB
    # RAID5 of 4: 3 data members, no power-of-two chunk fits a 1 MiB request
    r3 = parity_traffic(
        "raid5", 64 * KIB, {f"d{i}": {"read": 0, "write": 1} for i in range(4)}, 1, MIB
    )
    assert r3 is not None and "a chunk of" not in r3["advice"]
    assert parity_traffic("raid0", 512 * KIB, full, saved) is None


def test_each_members_writes_are_shown_by_exact_size() -> None:
    from iotune.train.parity import parity_traffic
    from iotune.train.render import member_sizes

    members = {
        "nvme1n1": {
            "read": MIB,
            "write": 48 * MIB + 20 * KIB,
            "write_sizes": {512 * KIB: 96, 4 * KIB: 3, 8 * KIB: 1, 12 * KIB: 2},
        },
        **{f"nvme{i}n1": {"read": 0, "write": 0, "write_sizes": {}} for i in (2, 3, 4)},
    }
    p = parity_traffic("raid6", 512 * KIB, members, 96 * MIB)
    assert p is not None
    assert member_sizes(p) == [
        "nvme1n1: wrote 48.0 MiB in 102 requests (512 KiB x96, 12 KiB x2, 4 KiB x3 and 1 "
        "other size(s)), read 1.0 MiB",
        *(f"nvme{i}n1: wrote 0.0 MiB in 0 requests, read 0.0 MiB" for i in (2, 3, 4)),
    ]


def test_the_report_shows_a_runs_saves_beside_the_model() -> None:
    from iotune.report.tables import checkpoint_table
    from iotune.study.record import checkpoint_summary

    c = 12 * 1000
    par = {"level": "raid6", "amplification": 2.01, "ideal": 2.0, "read_modify_write": False}
    ck = {
        "writer": "torch",
        "saves": [
            {"blocked_s": b, "durable_s": b + 1, "bytes": c + 10, "offload_read_bytes": c}
            | {"checkpoint_write_bytes": 2 * c, "parity": par}
            for b in (1.0, 3.0, 2.0)
        ],
        "estimate": {"read_bytes": c, "write_bytes": c, "exact": True},
        "checkpoint_drives": ["a", "b", "c", "d"],
    }
    s = checkpoint_summary(ck)
    assert s is not None and (s["saves"], s["blocked_s"], s["durable_s"]) == (3, 2.0, 3.0)
    assert (s["level"], s["amplification"], s["read_modify_write"]) == ("raid6", 2.01, False)
    assert checkpoint_summary({"saves": []}) is None and checkpoint_summary(None) is None
    run = {"preset": "tiny_opt_nvme", "strategy": "opt_nvme", "ga": 1, "checkpoints": s}
    header, rows = checkpoint_table([run, {"preset": "x", "ga": 1, "checkpoints": None}])
    (row,) = rows
    cells = dict(zip(header, row, strict=True))
    assert cells["Writer"] == "torch" and cells["Blocked s"] == "2.00"
    assert cells["Checkpoint volume"] == "raid6 of a, b, c, d"
    assert cells["Parity x (full stripes)"] == "2.010 (2.000)"


def test_the_report_shows_each_runs_persists_in_a_section_of_their_own() -> None:
    """--checkpoint-persist: the report's "Persisted saves" names the persist folder and its
    volume (a RAID6 of four) and gives the medians of the persists' seconds and bytes and of
    what the members wrote, with the parity beside its full-stripe ideal; a run without a
    persist has no row, and a report without any has no section."""
    from iotune.report.tables import persist_table
    from iotune.study.record import checkpoint_summary

    c = 12 * 1000
    par = {"level": "raid6", "amplification": 2.1, "ideal": 2.0, "read_modify_write": True}
    persists = [
        {"dir": "/mnt/ckpt/ck", "bytes": c, "seconds": t, "waited_s": t / 2}
        | {"write_bytes": 2 * c + w, "parity": par | {"amplification": a}}
        for t, w, a in ((8.0, 10, 2.05), (9.0, 30, 2.2), (7.0, 20, 2.1))
    ]
    ck = {
        "writer": "torch",
        "saves": [{"blocked_s": 0.2, "bytes": c, "persist": p} for p in persists],
        "persist_drives": ["a", "b", "c", "d"],
    }
    s = checkpoint_summary(ck)
    assert s is not None and s["persist"] == {
        "dir": "/mnt/ckpt/ck",
        "persists": 3,
        "seconds": 8.0,
        "waited_s": 4.0,
        "bytes": c,
        "write_bytes": 2 * c + 20,
        "drives": ["a", "b", "c", "d"],
        "level": "raid6",
        "amplification": 2.1,
        "ideal": 2.0,
    }
    bare = checkpoint_summary({"saves": [{"blocked_s": 0.2}]})
    assert bare is not None and bare["persist"] is None
    run = {"preset": "tiny_opt_nvme", "strategy": "opt_nvme", "ga": 1, "checkpoints": s}
    other = {"preset": "x", "ga": 1, "checkpoints": bare}
    header, rows = persist_table([run, other])
    (row,) = rows
    cells = dict(zip(header, row, strict=True))
    assert cells["Persisted to"] == "/mnt/ckpt/ck" and cells["Persists"] == "3"
    assert (cells["Durable after s"], cells["Waited s"]) == ("8.00", "4.00")
    assert cells["Persist volume"] == "raid6 of a, b, c, d"
    assert cells["Parity x (full stripes)"] == "2.100 (2.000)"
    assert persist_table([other])[1] == []
    # untraced (tmpfs, NFS): said, not a blank
    s["persist"] |= {"drives": [], "write_bytes": None, "level": None, "amplification": None}
    cells = dict(zip(header, persist_table([run])[1][0], strict=True))
    assert (cells["Persist volume"], cells["Written GiB"]) == ("not traced", "-")


def _traced(tmp_path: Path, writer: dict[str, object], *command: str) -> tuple[int, str]:
    import json

    from click.testing import CliRunner

    from iotune import cli as cli_mod

    cfg = json.loads(Path("tests/data/custom/opt_nvme.json").read_text())
    cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] = str(tmp_path / "swap")
    cfg["checkpoint"] = {"writer": writer}
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(cfg))
    args = ["trace", "--model", "tests/data/custom/gpt_neox", "--ds-config", str(ds)]
    r = CliRunner().invoke(cli_mod.cli, [*args, "--seq-len", "128", "--", *command])
    return r.exit_code, r.output


@pytest.mark.usefixtures("zygote_workers")  # its check's worker forks from the zygote
def test_a_script_whose_fast_writer_would_fail_is_refused_before_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CROSS_SIZE", raising=False)
    monkeypatch.delenv("CROSS_RANK", raising=False)
    script = "tests/data/custom/train_script.py"
    torchrun = ("python3", "-m", "torch.distributed.run", "--nproc_per_node", "1", script)
    rc, out = _traced(tmp_path, {"type": "fast"}, *torchrun)
    assert rc == 2 and "reads CROSS_RANK and CROSS_SIZE" in out, out
    assert "export CROSS_RANK=0 CROSS_SIZE=1" in out
    # a script without the main guard, under DeepSpeed's launcher, with the decoupled engine
    bare = tmp_path / "bare.py"
    bare.write_text("import deepspeed\nprint('training')\n")
    rc, out = _traced(tmp_path, {"type": "fast", "decoupled": True}, "deepspeed", str(bare))
    assert rc == 2 and 'has no `if __name__ == "__main__":` guard' in out, out
    assert not (tmp_path / "swap").exists()


def test_a_resumed_step_is_checked_against_the_saving_runs_loss(tmp_path: Path) -> None:
    from iotune.train.checkpoint import resume_note
    from iotune.workers.checkpoints import LOSSES, LossLedger, StepLosses, resume_check

    ck = tmp_path / "ck"
    saving = LossLedger(ck, None)
    for step, loss in ((1, 10.5), (2, 10.25), (3, 10.0)):
        saving.add(step, loss)
    # a run resumed from step 2 of the same folder writes its own steps over the saving run's
    again = LossLedger(ck, ck)
    again.add(3, 9.75)
    assert json.loads((ck / LOSSES).read_text()) == {"losses": {"1": 10.5, "2": 10.25, "3": 9.75}}
    # elsewhere: a ledger of its own
    assert LossLedger(tmp_path / "other", ck).losses == {}
    resume = {"dir": str(ck), "tag": "step2"}
    ok = resume_check(resume, 3, 9.7500004, "fp32")
    assert ok["ok"] is True and ok["saved_run_loss"] == 9.75 and ok["rel_diff"] < 1e-6
    assert resume_note(ok).startswith("resumed: step 3's loss 9.75000 continues the saving run's")
    # bf16 allows a GPU's reductions; fp32 does not
    assert resume_check(resume, 3, 9.755, "bf16")["ok"] is True
    assert resume_check(resume, 3, 9.76, "bf16")["ok"] is False
    bad = resume_check(resume, 3, 9.76, "fp32")
    assert bad["ok"] is False
    assert bad["message"] == (
        f"the run resumed from {ck / 'step2'} does not continue its loss: step 3 gave 9.76000, "
        "the saving run 9.75000 (relative difference 0.001, at most 0.0001 in fp32)"
    )
    assert resume_check(resume, 3, float("nan"), "bf16")["ok"] is False
    # the saving run did not train past the save: nothing to compare
    none = resume_check(resume, 4, 9.0, "fp32")
    assert none["ok"] is None and "not checked" in resume_note(none)

    class Events:
        def __init__(self) -> None:
            self.got: list[dict[str, object]] = []

        def emit(self, rec: dict[str, object]) -> None:
            self.got.append(rec)

    from iotune.workers.checkpoints import RunFails

    spec = {"resume": resume, "checkpoint": {"dir": str(tmp_path / "ck2")}}
    events = Events()
    steps = StepLosses(spec, 0, 2, "fp32")
    with pytest.raises(RunFails, match="does not continue its loss"):
        steps.add(3, 12.0, events)
    assert [e["event"] for e in events.got] == ["resume_check"]
    # only rank 0 checks
    StepLosses(spec, 1, 2, "fp32").add(3, 12.0, events)
    assert len(events.got) == 1


def test_every_resumed_step_the_saving_run_trained_is_checked(tmp_path: Path) -> None:
    """The first resumed step's loss depends on the weights alone; the second on the update
    the first made, so on Adam's moments and step count: a resume that lost them passes the
    first check and fails the second. Checked against the saving run's losses as they were
    when the run resumed, though its own ledger in the same folder replaces them."""
    from iotune.train.checkpoint import resume_checks, resume_note
    from iotune.workers.checkpoints import LOSSES, LossLedger, RunFails, StepLosses

    class Events:
        def __init__(self) -> None:
            self.got: list[dict[str, Any]] = []

        def emit(self, rec: dict[str, Any]) -> None:
            self.got.append(rec)

    ck = tmp_path / "ck"
    saving = LossLedger(ck, None)
    for step, loss in ((1, 10.5), (2, 10.25), (3, 10.0), (4, 9.5)):
        saving.add(step, loss)
    resume = {"dir": str(ck), "tag": "step2"}
    # resumed into the same folder: its ledger replaces steps 3 and 4 as it goes
    spec = {"resume": resume, "checkpoint": {"dir": str(ck)}}
    events = Events()
    steps = StepLosses(spec, 0, 2, "fp32")
    for step, loss in ((3, 10.0), (4, 9.5), (5, 9.25)):
        steps.add(step, loss, events)
    assert [(e["at_step"], e["ok"]) for e in events.got] == [(3, True), (4, True)]
    one = resume_checks(events.got)
    assert one is not None and one["ok"] is True and one["rel_diff"] == 0.0
    assert [s["at_step"] for s in one["steps"]] == [3, 4]
    assert resume_note(one) == (
        "resumed: steps 3-4's losses continue the saving run's (largest relative difference "
        "0, at most 0.0001)"
    )
    # Adam's state lost: the first step is the saving run's, the second is not
    saving = LossLedger(tmp_path / "ck2", None)
    for step, loss in ((1, 10.5), (2, 10.25), (3, 10.0), (4, 9.5)):
        saving.add(step, loss)
    spec = {"resume": {"dir": str(tmp_path / "ck2"), "tag": "step2"}}
    events = Events()
    steps = StepLosses(spec, 0, 2, "fp32")
    steps.add(3, 10.0, events)
    with pytest.raises(RunFails, match=r"step 4 gave 9\.52000, the saving run 9\.50000"):
        steps.add(4, 9.52, events)
    bad = resume_checks(events.got)
    assert bad is not None and bad["ok"] is False and bad["at_step"] == 4
    # resumed into the saving run's own folder: the step that fails is not written over the
    # saving run's loss for it, so a second try is checked against the same losses
    again = StepLosses({**spec, "checkpoint": {"dir": str(tmp_path / "ck2")}}, 0, 2, "fp32")
    again.add(3, 10.0, Events())
    with pytest.raises(RunFails):
        again.add(4, 9.52, Events())
    kept = json.loads((tmp_path / "ck2" / LOSSES).read_text())["losses"]
    # the failed step 4 is not written, and the saving run's own step 4 is still there for
    # the next try
    assert kept == {"1": 10.5, "2": 10.25, "3": 10.0, "4": 9.5}, kept
    assert resume_note(bad) == "resumed: step 4's loss 9.52000 is not the saving run's 9.50000"
    # only the first step overlaps: the note says what that does not check
    only = resume_checks(events.got[:1])
    assert only is not None and only["ok"] is True
    assert "not the optimizer's state" in resume_note(only)
    assert resume_checks([{"event": "step", "step": 3}]) is None


@pytest.mark.parametrize("command", [["run", "tiny_opt_nvme"], ["trace", "--run", "tiny_opt_nvme"]])
def test_an_unknown_writer_is_one_line_and_a_hint(command: list[str]) -> None:
    from click.testing import CliRunner

    from iotune import cli as cli_mod

    r = CliRunner().invoke(
        cli_mod.cli, [*command, "--checkpoint-writer", "fastest"], prog_name="iotune"
    )
    assert r.exit_code == 2
    assert r.output.splitlines() == [
        "iotune: error: Invalid value for '--checkpoint-writer': 'fastest' is not one of "
        "'torch', 'fast', 'decoupled'.",
        f"hint: 'iotune {command[0]} --help' lists the commands and options",
    ]


def test_the_writer_is_the_options_else_the_configs_else_torch() -> None:
    from iotune.train.checkpoint import with_writer

    tuned = {"type": "fast", "decoupled": True, "io_buffer_size": 1 << 30}
    cfg = {"train_batch_size": 1, "checkpoint": {"writer": tuned, "tag_validation": "Warn"}}
    # not given: the config's own writer, its knobs kept
    ck, out, notes = with_writer(Checkpointing(1, Path("/x"), "torch", writer_given=False), cfg)
    assert ck.writer == "decoupled" and out == cfg and notes == []
    # given: it replaces the config's writer, and says so
    ck, out, notes = with_writer(Checkpointing(1, Path("/x"), "fast"), cfg)
    assert out["checkpoint"]["writer"] == {**tuned, "decoupled": False}
    assert notes == ["--checkpoint-writer fast replaces the config's decoupled writer"]
    ck, out, notes = with_writer(Checkpointing(1, Path("/x"), "torch"), cfg)
    assert out["checkpoint"] == {"tag_validation": "Warn"} and len(notes) == 1
    # neither: torch.save, the config as it was
    bare = {"train_batch_size": 1}
    ck, out, notes = with_writer(Checkpointing(1, Path("/x"), "torch", writer_given=False), bare)
    assert ck.writer == "torch" and out == bare and notes == []


def test_parity_is_also_measured_against_what_the_array_was_asked() -> None:
    """The array's own diskstats (the save's files and the file system's log and metadata)
    bound the members' writes: full stripes 2x, each page alone 3x on a RAID6."""
    from iotune.train.parity import parity_traffic
    from iotune.train.render import parity_lines

    members = {f"d{i}": {"read": 0, "write": 13 * MIB} for i in range(4)}  # 52 MiB in all
    p = parity_traffic("raid6", 512 * KIB, members, 22 * MIB, asked=24 * MIB)
    assert p is not None
    assert p["array_write_bytes"] == 24 * MIB and p["partial_worst"] == 3.0
    assert p["array_amplification"] == round(52 / 24, 4)
    assert p["excess_bytes"] == 8 * MIB  # against the save's 22 MiB alone
    r5 = parity_traffic("raid5", 512 * KIB, members, 22 * MIB)
    assert r5 is not None and r5["partial_worst"] == 2.0 and r5["array_amplification"] is None
    lines = parity_lines({"checkpoints": {"saves": [{"tag": "step1", "parity": p}]}})
    assert lines[1] == (
        "  the array was asked to write 0.023 GiB (the files, the file system's log and "
        "metadata): the members wrote 2.167x that (full stripes 2.000x, page by page 3.000x)"
    )


def test_each_interval_carries_what_its_arrays_were_asked() -> None:
    """An md array has no requests to trace; the kernel's diskstats say what it was asked."""
    from types import SimpleNamespace

    from iotune.trace.diskstats import DiskStat
    from iotune.trace.model import step_rows

    def stat(r: int, w: int) -> DiskStat:
        return DiskStat(1, r, 1, w, 0, 0, 0)

    def sample(t: float, label: str, md_w: int, disk_w: int) -> SimpleNamespace:
        return SimpleNamespace(
            t=t,
            label=label,
            counts={},
            stats={"md0": stat(8, md_w), "vda": stat(0, disk_w)},
            lat={},
        )

    rows = step_rows(
        [sample(0, "start", 0, 0), sample(1, "checkpoint:1", 2048, 4096)],
        {"vda": 1, "md0": 2},
        ["vda"],
        0,
        False,
        "ready",
        ("md0",),
    )
    assert rows[0]["arrays"] == {"md0": {"read": 0, "write": 2048 * 512}}
    assert rows[0]["drives"]["vda"]["write"] == 4096 * 512
    assert (
        "arrays"
        not in step_rows(
            [sample(0, "start", 0, 0), sample(1, "step:1", 1, 1)],
            {"vda": 1},
            ["vda"],
            0,
            False,
            "r",
        )[0]
    )


def test_a_steps_row_counts_the_offload_volume_apart_from_the_volumes_beside_it() -> None:
    """Traced with a checkpoint or persist volume, a step's row holds the offload drives'
    totals apart (``primary``): a persist beside the step writes to its own volume, and the
    run's table of steps counts the offload volume alone. Counted by hand: the offload drive
    vda wrote 4096 sectors, the persist drive vdb 1000, in the step."""
    from types import SimpleNamespace

    from iotune.trace.diskstats import DiskStat
    from iotune.trace.model import step_rows
    from iotune.train.render import steps_table

    def stat(r: int, w: int) -> DiskStat:
        return DiskStat(1, r, 1, w, 0, 0, 0)

    def sample(t: float, label: str, a: int, b: int) -> SimpleNamespace:
        return SimpleNamespace(
            t=t, label=label, counts={}, stats={"vda": stat(8, a), "vdb": stat(0, b)}, lat={}
        )

    samples = [sample(0, "start", 0, 0), sample(1, "step:1", 4096, 1000)]
    args = ({"vda": 1, "vdb": 2}, ["vda", "vdb"], 0, False, "ready", ())
    (row,) = step_rows(samples, *args, ("vda",))
    assert row["write"]["bytes"] == (4096 + 1000) * 512  # every traced drive
    assert row["primary"]["write"]["bytes"] == 4096 * 512  # the offload drive alone
    assert row["primary"]["read"]["bytes"] == 0
    assert row["drives"]["vdb"]["write"] == 1000 * 512
    # all the traced drives the offload volume's (or none named): no row apart
    assert "primary" not in step_rows(samples, *args, ("vda", "vdb"))[0]
    assert "primary" not in step_rows(samples, *args)[0]
    # the per-step table prints the offload drive's 2 MiB, not the 2.49 MiB of both
    step: dict[str, Any] = dict.fromkeys(("forward_s", "backward_s", "optimizer_s"), 0.5)
    step |= {"event": "step", "step": 1, "step_s": 1.0, "loss": 2.0, "tokens_per_s": 0.5}
    step["swap"] = {"allocated": 0}
    result = {"events": [step], "io_steps": [row]}
    table = steps_table(result)
    write = next(c for c in table.columns if c.header == "WRITE GiB")
    assert list(write.cells) == [f"{4096 * 512 / 2**30:.3f}"], list(write.cells)


@pytest.mark.parametrize("folder", ["/proc", "/sys/kernel/iotune-ck"])
def test_a_checkpoint_folder_on_a_kernel_file_system_is_refused_as_such(
    folder: str, tmp_path: Path
) -> None:
    """/proc and /sys hold no files of their own: their 0 bytes free are not the reason."""
    from click.testing import CliRunner

    from iotune import cli as cli_mod

    (tmp_path / "off").mkdir()
    r = CliRunner().invoke(
        cli_mod.cli,
        [
            *("run", "tiny_opt_nvme", "--nvme-path", str(tmp_path / "off"), "--steps", "1"),
            *("--checkpoint-every", "1", "--checkpoint-dir", folder),
            *("--out", str(tmp_path / "out")),
        ],
        prog_name="iotune",
    )
    assert r.exit_code == 2, r.output
    first, hint = r.output.strip().splitlines()[-2:]
    fs = folder.split("/")[1].replace("sys", "sysfs")
    assert first == (
        f"iotune: error: --checkpoint-dir {folder} is on {fs}, the kernel's own file system: "
        "it holds no files a checkpoint could be written to"
    ), r.output
    assert "free" not in r.output and hint.startswith("hint: ")
    assert not (tmp_path / "out").exists()


def test_a_persisted_save_carries_its_copy_and_the_steps_beside_it_are_named() -> None:
    """--checkpoint-persist: each save's row holds its persist event (matched by tag, the
    last one emitted at the run's end), and the lines name what each copy wrote, when it was
    durable, the wait, and the steps whose reads include the copy's."""
    from iotune.train.render import persist_lines

    e = _est()
    saves = [
        {"event": "checkpoint", "step": s, "tag": f"step{s}", "writer": "torch"}
        | {"blocked_s": 0.1, "durable_s": 0.2, "files": 5, "bytes": (3 << 30) // 4}
        for s in (1, 2)
    ]
    persists = [
        {"event": "persist", "step": s, "tag": f"step{s}", "dir": "/ck", "files": 5}
        | {"bytes": (3 << 30) // 4}
        | {"copy_s": 1.5, "latest_s": 0.01, "seconds": 2.25, "waited_s": w}
        for s, w in ((1, 0.5), (2, 2.25))
    ]
    steps = [{"event": "step", "step": s} | ({"persist_beside": True} if s > 1 else {})
             for s in (1, 2)]  # fmt: skip
    from iotune.train.ranks import merge_ranks

    # one rank's record: each persist is its own event, with its save's step and tag
    every = merge_ranks([steps[0], saves[0], persists[0], steps[1], saves[1], persists[1]])
    assert [x for x in every if x["event"] == "persist"] == persists
    doc = save_rows(every, [], e, True, (), ())
    assert doc is not None
    assert [r["persist"] for r in doc["saves"]] == persists
    lines = persist_lines({"checkpoints": doc, "events": [steps[0], saves[0], steps[1]]})
    assert lines == [
        "step1: persisted into /ck: 0.750 GiB in 5 files by the aio copy, durable with its "
        "latest 2.25 s after the save; waited for 0.50 s",
        "step2: persisted into /ck: 0.750 GiB in 5 files by the aio copy, durable with its "
        "latest 2.25 s after the save; waited for 2.25 s",
        "step(s) 2 ran beside a persist: their reads of the offload volume include the copy's "
        "reads of the snapshot, and their writes its writes to the persist volume (on the "
        "same drives)",
    ]
    # its drives traced apart from the offload volume's: the persist's writes are its own
    apart = {"checkpoints": doc, "events": [steps[0], saves[0], steps[1]]}
    apart["io_steps"] = [{"label": "step:2", "primary": {}}]
    assert persist_lines(apart)[-1] == (
        "step(s) 2 ran beside a persist: their reads of the offload volume include the copy's "
        "reads of the snapshot; its writes to the persist volume are the persist's, not theirs"
    )
    # without a persist: no row holds one, and nothing is said
    bare = save_rows([steps[0], saves[0]], [], e, True, (), ())
    assert bare is not None and bare["saves"][0]["persist"] is None
    assert persist_lines({"checkpoints": bare, "events": [steps[0]]}) == []


def test_a_persists_io_is_the_persist_volumes_from_its_save_to_its_wait() -> None:
    """Traced, a persist's copy is what the persist volume's drives did from its save's end
    (``checkpoint:S``) to the interval its wait ends (``persist:S``): the steps between
    (the copy runs beside them) and the wait, and nothing before the save or after the
    wait. On a RAID6 of four the members' writes stand against the persist's bytes (full
    stripes: 2x); counted here by hand."""
    from iotune.trace.targets import Array
    from iotune.train.render import parity_lines, persist_lines

    e = _est()
    members = ("p0", "p1", "p2", "p3")
    arr = Array("ck", "raid6", 512 * KIB, members)

    def row(label: str, each: int, reads: int = 0) -> dict[str, Any]:
        # each persist member writes *each* bytes in 1 MiB requests, the offload drive none
        return {
            "label": label,
            "read": {"bytes": 4 * reads},
            "write": {"bytes": 4096 + 4 * each},
            "drives": {
                "off": {"read": 0, "write": 4096, "write_sizes": {4096: 1}},
                **{
                    n: {"read": reads, "write": each, "write_sizes": {MIB: each // MIB}}
                    for n in members
                },
            },
            "arrays": {"ck": {"write": 2 * each}},
        }

    io = [
        row("step:1", 0),
        row("checkpoint:1", 3 * MIB),  # before the persist: not its
        row("step:2", 2 * MIB, reads=4096),
        row("persist:1", MIB),  # the wait
        row("checkpoint:2", 0),
        row("persist:2", 4 * MIB),  # the run's end waited for all of it
    ]
    events: list[dict[str, Any]] = []
    for s, saved in ((1, 6 * MIB), (2, 8 * MIB)):
        events += [
            {"event": "step", "step": s},
            {"event": "checkpoint", "step": s, "tag": f"step{s}", "writer": "torch"}
            | {"blocked_s": 0.01, "durable_s": 0.02, "files": 5, "bytes": saved},
        ]
    events += [
        {"event": "persist", "step": s, "tag": f"step{s}", "dir": "/ck", "files": 5}
        | {"bytes": saved, "copy_s": 1.0, "latest_s": 0.01, "seconds": 2.0, "waited_s": 0.5}
        for s, saved in ((1, 6 * MIB), (2, 8 * MIB))
    ]
    doc = save_rows(events, io, e, True, ("off",), ("off",), None, None, members, arr, MIB)
    assert doc is not None and doc["persist_drives"] == list(members)
    one, two = (r["persist"] for r in doc["saves"])
    assert one["intervals"] == ["step:2", "persist:1"] and two["intervals"] == ["persist:2"]
    # persist 1: (2 + 1) MiB on each of 4 members = 12 MiB for 6 MiB: 2x, full stripes
    assert one["write_bytes"] == 12 * MIB and one["read_bytes"] == 4 * 4096
    assert one["write_sizes"] == {MIB: 12}
    p1 = one["parity"]
    assert (p1["amplification"], p1["ideal"], p1["excess_bytes"]) == (2.0, 2.0, 0), p1
    assert p1["array_write_bytes"] == 2 * 3 * MIB and p1["array_amplification"] == 2.0
    assert p1["per_member"]["p0"] == {"read": 4096, "write": 3 * MIB, "sizes": {MIB: 3}}
    assert p1["advice"] is None  # 1 MiB requests fill the 1 MiB stripe (2 x 512 KiB)
    # persist 2: 4 x 4 MiB = 16 MiB for 8 MiB
    assert two["write_bytes"] == 16 * MIB and two["parity"]["amplification"] == 2.0
    lines = parity_lines({"checkpoints": doc})
    assert lines[0] == (
        "step1 persisted: raid6 of 4, chunk 512 KiB: the members wrote 0.012 GiB for the "
        "persist's 0.006 GiB, 2.000x (full stripes: 2.000x), and read 0.0 MiB back"
    )
    assert sum(x.startswith("step2 persisted: raid6 of 4") for x in lines) == 1
    assert persist_lines({"checkpoints": doc, "events": []})[0].endswith(
        "; the persist volume's drives wrote 0.012 GiB for it"
    )
    # the table of steps has a row for each persist's wait, with its interval's bytes
    from rich.console import Console

    from iotune.train.render import steps_table

    con = Console(width=200, record=True)
    step: dict[str, Any] = {"forward_s": 1.0, "backward_s": 1.0, "optimizer_s": 1.0}
    step |= {"step_s": 3.0, "tokens_per_s": 1.0, "loss": 1.0, "host_rss_bytes": 0}
    step |= {"event": "step", "step": 2, "swap": {"allocated": 0}}
    con.print(steps_table({"events": [step, events[-2]], "io_steps": io}))
    line = next(x for x in con.export_text().splitlines() if x.startswith("persist step1"))
    # waited 0.50 s (TOTAL); the wait's interval read 0 and wrote 4096 + 4 x 1 MiB (GiB)
    want = ["-", "-", "-", "0.500", "-", "-", "-", "-", "0.000", "0.004", "-"]
    assert line.split()[2:] == want, line
    # untraced (no intervals), or the persist volume's drives not named: the event as it is
    bare = save_rows(events, [], e, True, (), (), None, None, members, arr, MIB)
    assert bare is not None and bare["saves"][0]["persist"] == events[-2]
    none = save_rows(events, io, e, True, ("off",), ("off",))
    assert none is not None and none["saves"][1]["persist"] == events[-1]
    assert "persist_drives" in none and none["persist_drives"] == []


def test_a_persist_is_refused_unless_its_saves_are_snapshots_on_another_volume(
    tmp_path: Path,
) -> None:
    from iotune.train.copies import check_persist, snapshot_steps

    snap = Checkpointing(2, tmp_path / "snap", persist=tmp_path / "ck")
    # the snapshot folder holds the save being copied and the next: two saves' room, not all
    assert snapshot_steps(snap, 9) == 4 and snapshot_steps(snap, 3) == 3
    assert snapshot_steps(Checkpointing(2, tmp_path / "snap"), 9) == 9
    assert check_persist(Checkpointing(2, tmp_path / "snap"), 9, [], 1, "aio") == []
    with pytest.raises(UsageError, match="this run's saves copy the swap files by aio") as e:
        check_persist(snap, 9, [], 1, "aio")
    assert "--checkpoint-copy reflink" in (e.value.hint or "")
    # tmp_path's two folders are on one file system: the persist would guard nothing
    with pytest.raises(UsageError, match="is on the volume of the snapshots") as e:
        check_persist(snap, 9, [], 1, "reflink")
    assert "a volume of its own" in (e.value.hint or "")
    assert not (tmp_path / "ck").exists() and not (tmp_path / "snap").exists()


def test_a_persist_needs_saves(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--checkpoint-persist copies each save taken by"):
        make_request(
            "tiny_opt_nvme",
            *("auto", str(tmp_path / "out"), None, None, (), None, None, None, False, False),
            checkpoint_persist=str(tmp_path / "ck"),
        )


def test_a_resumed_runs_note_names_what_its_initialisation_moved_beyond_the_model() -> None:
    from iotune.train.checkpoint import resume_io_note

    two = [{"copy": "aio", "bytes": 3 << 29, "source": "a"}, {"copy": "aio", "bytes": 1 << 29}]
    assert resume_io_note(two) == (
        "resumed: the initialisation's I/O includes the save's swap files copied back into the "
        "swap folder (2.000 GiB by aio) and DeepSpeed's reload of the optimizer state through "
        "them; the I/O model's initialisation is a fresh start's"
    )
    assert "swap folder and DeepSpeed's" in resume_io_note([])
