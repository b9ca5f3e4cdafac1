"""Unit: the checkpoint planner (``iotune estimate --checkpoint-every``), pure arithmetic
against hand-worked figures, and its bad input."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune.errors import UsageError
from iotune.plan.ckplan import checkpoint_plan, narrowest, parse_share, plan_saves
from iotune.plan.cksweeps import writer_rows
from iotune.plan.datasheet import DriveSpec

GB = 1e9


def _drive(**kw: float) -> DriveSpec:
    return DriveSpec("--drive", "d", read=kw.get("read", 2 * GB), write=kw.get("write", GB))


def test_a_save_takes_the_longer_of_the_copy_read_and_the_members_writes() -> None:
    # 12 GB a save; RAID6 of 4: 2 data members, each writes 6 GB at 1 GB/s = 6 s
    plans = plan_saves(12 * GB, 4 * GB, step_s=10.0, every=10, level=6, drive=_drive())
    four = plans[0]
    assert (four.width, four.member_bytes, four.write_s, four.read_s) == (4, 6 * GB, 6.0, 3.0)
    assert four.save_s == 6.0 and four.bound == "checkpoint writes"
    assert four.share == pytest.approx(6.0 / (100.0 + 6.0))
    # RAID6 of 10: 8 data members, 1.5 s of writes; the copy's 3 s read bounds it
    ten = next(p for p in plans if p.width == 10)
    assert ten.save_s == 3.0 and ten.bound == "offload reads"
    # RAID5 of 3: 2 data members; the state in host memory: no read
    r5 = plan_saves(12 * GB, None, 10.0, 1, 5, _drive(), widths=range(3, 4))
    assert r5[0].read_s is None and r5[0].save_s == 6.0


def test_the_slc_cache_and_the_derating_slow_the_members() -> None:
    d = DriveSpec("--drive", "d", read=GB, write=2 * GB, cache=2 * GB, after_cache=0.5 * GB)
    (p,) = plan_saves(12 * GB, None, 1.0, 1, 6, d, write_derate=0.5, widths=range(4, 5))
    # 6 GB a member: 2 GB at 1 GB/s (derated), 4 GB at the sustained 0.5 GB/s
    assert p.write_s == pytest.approx(2.0 + 8.0)


def test_the_narrowest_width_under_the_share_and_why_none_is() -> None:
    plans = plan_saves(12 * GB, 4 * GB, 10.0, 10, 6, _drive())
    best, answer = narrowest(plans, 0.04)
    assert best is not None and best.share <= 0.04
    assert all(p.share > 0.04 for p in plans if p.width < best.width)
    assert answer.startswith(f"a RAID6 of {best.width} keeps a save every 10 step(s) at")
    # a save every step: the copy's read alone is 3 s of a 13 s step and save
    none, why = narrowest(plan_saves(12 * GB, 4 * GB, 10.0, 1, 6, _drive()), 0.05)
    assert none is None and "reads 3.0 s from the offload volume" in why


def test_the_plan_needs_a_step_time_and_the_drives() -> None:
    with pytest.raises(
        UsageError, match="needs the checkpoint drives: their datasheet, or a sweep"
    ):
        checkpoint_plan(GB, True, None, 10.0, GB, None, 1, 6, 0.05)
    with pytest.raises(UsageError, match="needs the step's time"):
        checkpoint_plan(GB, True, None, None, None, _drive(), 1, 6, 0.05)
    assert parse_share("5%") == 0.05 and parse_share("0.1") == 0.1
    for bad in ("0", "150%", "five"):
        with pytest.raises(UsageError, match="is not a share"):
            parse_share(bad)


def test_estimate_prints_the_checkpoint_plan_from_the_study() -> None:
    args = [
        "--json",
        "estimate",
        "opt_nvme_16b",
        *("--baseline", "study", "--drive", "samsung-980-pro-2tb", "--drives", "1,2,4,8"),
        *("--checkpoint-every", "50", "--checkpoint-share", "2%"),
    ]
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune")
    assert r.exit_code == 0, r.output
    ck = json.loads(r.output)["checkpoints"]
    # 12 bytes a parameter of the study's 16B: 180 GiB a save
    assert round(ck["save_bytes"] / 2**30) == 180
    assert ck["offload"] == "RAID0 of 8 (the drives plan)" and ck["level"] == "raid6"
    assert ck["width"] == 4 and ck["plans"][0]["share"] <= 0.02
    bad = CliRunner().invoke(
        cli_mod.cli, [*args[1:3], "--checkpoint-every", "5"], prog_name="iotune"
    )
    assert bad.exit_code == 2 and "needs the checkpoint drives" in bad.output


def _sweep() -> dict[str, Any]:
    """sweep-checkpoint's result, in the shape of its H100 record (6 GB saves)."""
    from iotune.sweep.ckpt import Knobs

    best = {
        **asdict(Knobs(crc32=False, io_buffer_size=16 << 20, block_size=8 << 20)),
        "status": "ok",
    }
    return {
        "target": "/var/tmp/ckpt",
        "torch": {"status": "ok", "bytes": 6 * GB, "blocked_s": 3.45, "durable_s": 6.02},
        "default": {"status": "ok", "bytes": 6 * GB, "blocked_s": 8.61, "durable_s": 8.61},
        "best": {**best, "bytes": 6 * GB, "blocked_s": 4.49, "durable_s": 4.49},
    }


def test_each_writer_scaled_from_the_sweep_of_the_checkpoint_volume() -> None:
    torch, default, tuned, dec = writer_rows(12 * GB, False, 10, 1.0, _sweep())
    assert torch["writer"] == "torch"
    assert (torch["waits_s"], torch["durable_s"]) == (6.9, 12.04)
    assert torch["share"] == pytest.approx(6.9 / 16.9, abs=1e-4)
    assert default["how"] == "FastPersist with DeepSpeed's defaults"
    assert default["waits_s"] == default["durable_s"] == 17.22
    assert tuned["writer"] == "fast" and tuned["durable_s"] == 8.98 and "no CRC32" in tuned["how"]
    # decoupled: the step waits only where the next save comes before this one is durable
    assert dec["writer"] == "decoupled"
    assert (dec["waits_s"], dec["durable_s"], dec["share"]) == (0.0, 8.98, 0.0)
    (dec5,) = [
        r for r in writer_rows(12 * GB, False, 5, 1.0, _sweep()) if r["writer"] == "decoupled"
    ]
    assert dec5["waits_s"] == pytest.approx(3.98)
    # the optimizer state on NVMe: every writer copies the swap files, none planned apart
    assert writer_rows(12 * GB, True, 10, 1.0, _sweep()) == []


def test_a_sweep_alone_plans_the_writers_without_a_datasheet() -> None:
    ck = checkpoint_plan(12 * GB, False, None, 1.0, None, None, 10, 6, 0.05, _sweep())
    assert ck["plans"] == [] and ck["drive"] is None
    assert [r["writer"] for r in ck["writers"]] == ["torch", "fast", "fast", "decoupled"]
    assert (
        ck["answer"]
        == "on the swept volume, decoupled keep(s) a save every 10 step(s) under 5% of the training"
    )
    on_nvme = checkpoint_plan(12 * GB, True, None, 1.0, 2 * GB, _drive(), 10, 6, 0.05, _sweep())
    assert on_nvme["writers"] == [] and "shutil.copytree" in on_nvme["writers_note"]


def test_estimate_plans_each_writer_from_the_h100_sweep(tmp_path: Path) -> None:
    top = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    args = [
        "--json",
        "estimate",
        "opt_ram_1b",
        *("--baseline", str(top / "gpu-study-grid-h100/study-1b/runs/opt_ram_1b")),
        *("--checkpoint-every", "10", "--checkpoint-sweep", str(top / "gpu-ckpt-sweep-h100/ckpt")),
    ]
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune")
    assert r.exit_code == 0, r.output
    ck = json.loads(r.output)["checkpoints"]
    assert [w["writer"] for w in ck["writers"]] == ["torch", "fast", "fast", "decoupled"]
    # the RAM run's own step, 12 bytes a parameter a save
    assert ck["save_bytes"] == 12 * json.loads(r.output)["params"]
    assert 1.0 < ck["step_s"] < 3.0
    assert ck["writers"][3]["waits_s"] == 0.0 < ck["writers"][3]["durable_s"]
    # bad input: one line and a hint
    for extra, message in (
        (["--checkpoint-sweep", str(tmp_path)], "holds no sweep-checkpoint result"),
        ([], "--checkpoint-sweep plans checkpoints, and --checkpoint-every says how often"),
    ):
        bad = [a for a in args[:-4] if a != "--json"] + (
            ["--checkpoint-every", "10", *extra] if extra else ["--checkpoint-sweep", str(tmp_path)]
        )
        rb = CliRunner().invoke(cli_mod.cli, bad, prog_name="iotune")
        assert rb.exit_code == 2 and message in rb.output, rb.output


TOP = Path(__file__).resolve().parents[2]
#: an NVMe run of the 1B on the H100 machine, its sweep and its thread sweep
RUN_1B = TOP / "benchmarks/results/gpu-study-grid-h100/study-1b/runs/opt_nvme_1b"
SWEEP = TOP / "tests/data/study-h100/sweep-aio"
THREADS = TOP / "tests/data/study-h100/threads"


def _published_write() -> tuple[float, str]:
    """DeepSpeed's published write ratio, read from the profile table itself."""
    import tomllib

    doc = tomllib.loads((TOP / "configs" / "drives.toml").read_text())
    return float(doc["derate"]["write"]), str(doc["derate"]["write_source"])


def _ckplan(*extra: str) -> tuple[dict[str, Any], dict[str, Any]]:
    args = [
        *("--json", "estimate", "opt_nvme_1b", "--baseline", str(RUN_1B)),
        *("--threads-config", str(THREADS), "--aio-config", str(SWEEP)),
        *("--checkpoint-every", "10", *extra),
    ]
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    return doc["checkpoints"], doc.get("drives") or {}


def test_the_checkpoint_drives_derating_is_their_own_whatever_else_is_planned() -> None:
    factor, source = _published_write()
    ck = ("--checkpoint-drive", "samsung-980-pro-2tb")
    # alone; with a drives plan from the sweep; with another kind of offload drive, which the
    # sweep measured (its factor is that drive's, not the checkpoint drive's)
    for extra in ((), ("--drives", "1,2,4,8"), ("--drive", "wd-black-sn770-2tb")):
        plan, _ = _ckplan(*ck, *extra)
        assert plan["write_derate"] == factor, extra
        assert plan["write_derate_measured"] is False
        assert source in plan["write_derate_source"]
        # the members' writes at the derated datasheet rate, by hand: a RAID6 of 4 has two
        # data members, each writes half the save at 5.1 GB/s x the factor (no SLC figures)
        four = next(p for p in plan["plans"] if p["width"] == 4)
        assert four["write_s"] == pytest.approx(plan["save_bytes"] / 2 / (5.1e9 * factor), abs=1e-3)


def test_a_measurement_of_the_same_kind_of_drive_derates_the_checkpoint_drives() -> None:
    # --drive samsung-980-pro-2tb: the sweep measured the offload drives as that kind
    for extra in ((), ("--checkpoint-drive", "samsung-980-pro-2tb")):
        plan, drives = _ckplan("--drive", "samsung-980-pro-2tb", *extra)
        (write,) = [x for x in drives["limits"] if x["what"] == "one drive, write (measured)"]
        assert plan["write_derate"] == pytest.approx(write["value"] / 5.1e9)
        assert plan["write_derate_measured"] is True
        assert "measured" in plan["write_derate_source"]


def test_the_output_says_which_derating_the_checkpoint_plan_used() -> None:
    factor, source = _published_write()
    args = [
        *("estimate", "opt_nvme_1b", "--baseline", str(RUN_1B)),
        *("--threads-config", str(THREADS), "--aio-config", str(SWEEP)),
        *("--checkpoint-every", "10", "--checkpoint-drive", "samsung-980-pro-2tb"),
    ]
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune", terminal_width=400)
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if "checkpoint drives' writes" in x)
    assert f"x {factor:.2f}" in line and "DeepSpeed's published" in line and source in line


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch", "--checkpoint-drive 'nosuch' is no drive profile"),
        ("read=1GB/s", "--checkpoint-drive needs a sequential write rate"),
        ("samsung-980-pro-2tb,speed=1", "--checkpoint-drive has no key 'speed'"),
    ],
)
def test_a_bad_checkpoint_drive_is_named_as_such(spec: str, message: str) -> None:
    args = [
        *("estimate", "opt_nvme_16b", "--baseline", "study", "--drive", "samsung-980-pro-2tb"),
        *("--checkpoint-every", "5", "--checkpoint-drive", spec),
    ]
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune")
    assert r.exit_code == 2, r.output
    first, hint = r.output.strip().splitlines()
    assert first == f"iotune: error: {message}"
    assert hint.startswith("hint: ") and "--drive " not in first.replace("--checkpoint-drive", "")


# exact figures and words: each worked by hand from the module's docstring


def test_a_save_plans_json_has_its_keys_and_rounding() -> None:
    from iotune.plan.ckplan import SavePlan

    # every 3 steps of 1.5 s: 4.5 s of training a save; the 2.34567 s write bounds the save
    pl = SavePlan(5, 6, 4e9 + 0.4, 1.23456, 2.34567, 3, 1.5)
    assert pl.to_json() == {
        "width": 5,
        "level": "raid6",
        "member_write_bytes": 4_000_000_000,
        "read_s": 1.235,
        "write_s": 2.346,
        "save_s": 2.346,
        "bound_by": "checkpoint writes",
        # 2.34567 / (4.5 + 2.34567) = 0.342650...
        "share": 0.3427,
    }
    # the state in host memory: nothing read back; a read longer than the write bounds it
    assert SavePlan(3, 5, 1.0, None, 0.12345, 1, 1.0).to_json()["read_s"] is None
    slow = SavePlan(3, 5, 1.0, 3.00049, 1.0, 1, 1.0)
    assert slow.bound == "offload reads" and slow.to_json()["save_s"] == 3.0
    assert slow.to_json()["read_s"] == 3.0


def test_a_bad_checkpoint_drive_hint_names_the_option_given() -> None:
    from iotune.plan.ckplan import parse_checkpoint_drive

    with pytest.raises(UsageError) as exc:
        parse_checkpoint_drive("read=1GB/s")
    assert exc.value.message == "--checkpoint-drive needs a sequential write rate"
    assert exc.value.hint == (
        "--checkpoint-drive 'read=7.0GB/s,write=5.1GB/s,link=16GT/s x4,capacity=2TB,tbw=1200TB'"
    )


def test_the_checkpoint_derating_measured_or_published_exactly() -> None:
    from iotune.plan.ckplan import checkpoint_derate
    from iotune.plan.datasheet import Derate

    d = _drive()
    measured = {"measured": True, "read": 0.8, "write": 0.7, "source": "sweep of /dev/md0"}
    assert checkpoint_derate(d, d, measured) == Derate(
        0.8, 0.7, "measured on the offload drives, the same kind (sweep of /dev/md0)", True
    )
    # the published source names both references; the write's, itself quoting a "write: "
    pub = Derate(0.77, 0.74, "read: blog A; write: tutorial B (ds_io write: 3.18 GB/s)")
    assert checkpoint_derate(d, None, measured, pub) == Derate(
        0.77, 0.74, "DeepSpeed's published ratio (tutorial B (ds_io write: 3.18 GB/s))"
    )
    # a source that does not name them apart is given whole
    plain = Derate(0.77, 0.74, "DeepNVMe")
    assert (
        checkpoint_derate(d, None, None, plain).source == "DeepSpeed's published ratio (DeepNVMe)"
    )
    # another kind of offload drive: its measurement does not carry over
    other = DriveSpec("--drive", "d", read=3 * GB, write=GB)
    assert checkpoint_derate(d, other, measured, plain).measured is False


def test_a_share_is_strictly_between_none_and_all_of_the_training() -> None:
    for bad in ("1", "100%", "-5%", "abc"):
        with pytest.raises(UsageError) as exc:
            parse_share(bad)
        assert exc.value.message == (
            f"--checkpoint-share {bad!r} is not a share of the training's time"
        )
        assert exc.value.hint == "--checkpoint-share 5%"
    assert parse_share(" 99% ") == pytest.approx(0.99)


def _saves(writes: list[float], read_s: float | None, every: int = 9) -> list[Any]:
    from iotune.plan.ckplan import SavePlan

    return [
        SavePlan(w, 6, 1.0, read_s, s, every, 1.0) for w, s in zip((4, 5, 6), writes, strict=True)
    ]


def test_the_narrowest_answer_in_words_exactly() -> None:
    # 9 steps of 1 s: a 1 s save is 1 / (9 + 1) = 10% exactly, which is at most 10%
    best, answer = narrowest(_saves([3.0, 1.0, 0.5], None), 0.1)
    assert best is not None and best.width == 5
    assert (
        answer == "a RAID6 of 5 keeps a save every 9 step(s) at 10.0% of the training (at most 10%)"
    )
    assert narrowest([], 0.1) == (None, "no width planned")
    # the widest, 6: a 2 s write of 11 s; 18.2%
    none, why = narrowest(_saves([4.0, 3.0, 2.0], None), 0.05)
    assert none is None
    assert why == (
        "no RAID6 up to 6 drives keeps it under 5%: even 6 drives take 18.2%: save less often"
    )
    none, why = narrowest(_saves([4.0, 3.0, 2.0], 2.5), 0.05)
    assert why == (
        "no RAID6 up to 6 drives keeps it under 5%: each save reads 2.5 s from the offload "
        "volume, which no width of the checkpoint array shortens: save less often "
        "(--checkpoint-every) or read faster"
    )


BEST = "FastPersist as tuned (16 MiB double, 8 MiB blocks, qd 8, 1 thread(s), no CRC32)"


def test_each_writers_row_exactly_and_a_failed_record_skipped() -> None:
    sw = _sweep()
    sw["default"] = {**sw["default"], "status": "failed"}
    # a 7 GB save from the 6 GB sweep: each time x 7/6; 10 steps of 1 s between saves
    rows = writer_rows(7 * GB, False, 10, 1.0, sw)
    assert rows == [
        {
            "writer": "torch",
            "how": "torch.save, DeepSpeed's default",
            "waits_s": 4.025,
            "durable_s": 7.023,
            "share": 0.287,
        },
        {
            "writer": "fast",
            "how": BEST,
            "waits_s": 5.238,
            "durable_s": 5.238,
            # 5.238333 / 15.238333
            "share": 0.3438,
        },
        {
            "writer": "decoupled",
            "how": "FastPersist as tuned, in its own process",
            "waits_s": 0.0,
            "durable_s": 5.238,
            "share": 0.0,
        },
    ]
    # no tuned record: the torch writer alone
    only = writer_rows(6 * GB, False, 10, 1.0, {"torch": _sweep()["torch"]})
    assert [r["writer"] for r in only] == ["torch"]


def _drives_plan(target: int | None) -> dict[str, Any]:
    rows = [
        {"drives": 2, "step_s": 10.0, "read_bw_bytes_s": 4e9},
        {"drives": 4, "step_s": 8.0, "read_bw_bytes_s": 8e9},
    ]
    return {"plans": rows, "target": None if target is None else {"drives": target}}


def test_the_checkpoint_plan_on_nvme_from_the_drives_plan_exactly() -> None:
    from iotune.plan.datasheet import Derate

    d = _drive()
    ck = checkpoint_plan(
        12 * GB, True, _drives_plan(2), None, None, d, 10, 6, 0.05, derate=Derate(0.9, 0.5, "src")
    )
    plans = ck.pop("plans")
    assert ck == {
        "save_bytes": 12_000_000_000,
        "every": 10,
        "level": "raid6",
        "step_s": 10.0,
        "offload": "RAID0 of 2 (the drives plan)",
        "offload_read_bytes_s": 4_000_000_000,
        "drive": d.to_json(),
        "writers": [],
        "writers_volume": None,
        "copies": [],
        "copies_volumes": None,
        "copies_note": "each width's SAVE s is a copy at the drives' rates, its reads and "
        "writes at once (--checkpoint-copy aio: the step waits for it, durable at its end); "
        "DeepSpeed's copytree goes through the page cache and is known only where measured "
        "(--checkpoint-sweep RUN of 'iotune sweep-checkpoint --copy-from')",
        "writers_note": "with the optimizer state on NVMe every writer copies the swap files "
        "(shutil.copytree): the writer only writes the small files beside them",
        "write_derate": 0.5,
        "write_derate_source": "src",
        "write_derate_measured": False,
        "share_target": 0.05,
        # members write at 0.5 GB/s: 24 / (W - 2) s against 100 s of steps; 4.8 s at 7
        "width": 7,
        "answer": "a RAID6 of 7 keeps a save every 10 step(s) at 4.6% of the training (at most 5%)",
    }
    assert [p["width"] for p in plans] == list(range(4, 17))
    assert plans[0] == {
        "width": 4,
        "level": "raid6",
        "member_write_bytes": 6_000_000_000,
        "read_s": 3.0,
        "write_s": 12.0,
        "save_s": 12.0,
        "bound_by": "checkpoint writes",
        "share": 0.1071,
    }
    # without the plan's target: its widest RAID0, 8 GB/s
    wide = checkpoint_plan(
        12 * GB, True, _drives_plan(None), None, None, d, 10, 6, 0.05, derate=Derate(1, 1, "s")
    )
    assert wide["offload"] == "RAID0 of 4 (the drives plan)" and wide["step_s"] == 8.0
    assert wide["offload_read_bytes_s"] == 8_000_000_000 and wide["plans"][0]["read_s"] == 1.5


def test_the_checkpoint_plan_in_host_memory_with_the_published_derating() -> None:
    factor, source = _published_write()
    d = _drive()
    ck = checkpoint_plan(12 * GB, False, None, 1.23456, 2 * GB, d, 10, 5, 0.5)
    assert ck["offload"] == "the swept or run volume" and ck["step_s"] == 1.235
    assert ck["offload_read_bytes_s"] is None and ck["writers_volume"] is None
    assert ck["writers_note"] == (
        "each writer: --checkpoint-sweep RUN (iotune sweep-checkpoint on the checkpoint volume)"
    )
    assert ck["write_derate"] == factor and ck["write_derate_measured"] is False
    assert ck["write_derate_source"] == f"DeepSpeed's published ratio ({source})"
    # RAID5 of 3: two data members, 6 GB each at the derated 1 GB/s; nothing read back
    assert ck["plans"][0]["read_s"] is None
    assert ck["plans"][0]["write_s"] == pytest.approx(6 / factor, abs=1e-3)


def test_the_plan_refusals_word_for_word() -> None:
    with pytest.raises(UsageError) as exc:
        checkpoint_plan(GB, True, None, 10.0, GB, None, 1, 6, 0.05)
    assert (exc.value.message, exc.value.hint) == (
        "--checkpoint-every needs the checkpoint drives: their datasheet, or a sweep of the "
        "checkpoint volume",
        "--checkpoint-drive samsung-980-pro-2tb (or --drive for the same drives), or "
        "--checkpoint-sweep RUN (iotune sweep-checkpoint)",
    )
    with pytest.raises(UsageError) as exc:
        checkpoint_plan(GB, True, None, None, None, _drive(), 1, 6, 0.05)
    assert (exc.value.message, exc.value.hint) == (
        "--checkpoint-every needs the step's time, which nothing given predicts",
        "add --baseline RUN (a run of this model), with --drive SPEC or --aio-config SWEEP",
    )


def _small_sweep() -> dict[str, Any]:
    sw = _sweep()
    return {
        "target": "/var/tmp/ckpt",
        "torch": {"status": "ok", "bytes": GB, "blocked_s": 1.0, "durable_s": 2.0},
        "default": {"status": "failed", "bytes": GB, "blocked_s": 0.5, "durable_s": 0.5},
        "best": {**sw["best"], "bytes": GB, "blocked_s": 3.0, "durable_s": 5.0},
    }


def test_a_sweep_alone_answers_with_the_writers_that_fit() -> None:
    from iotune.plan.datasheet import Derate

    # 9 steps of 1 s: torch waits 1 s of 10 (10% exactly), decoupled none, the tuned 3 of 12
    ck = checkpoint_plan(
        GB, False, None, 1.0, None, None, 9, 6, 0.1, _small_sweep(), derate=Derate(1, 0.5, "s")
    )
    assert ck["answer"] == (
        "on the swept volume, decoupled, torch keep(s) a save every 9 step(s) under 10% of the "
        "training"
    )
    assert ck["writers_volume"] == "/var/tmp/ckpt" and ck["writers_note"] is None
    assert ck["plans"] == [] and ck["width"] is None and ck["write_derate"] == 0.5
    # every step: decoupled waits 4 s of the 5 it takes to be durable
    ck = checkpoint_plan(GB, False, None, 1.0, None, None, 1, 6, 0.05, _small_sweep())
    assert ck["answer"] == (
        "no writer keeps a save every 1 step(s) under 5% on the swept volume: save less often, "
        "or plan a wider array (--checkpoint-drive)"
    )


def test_the_estimates_checkpoint_plan_from_its_options_exactly() -> None:
    """plan_for_estimate, the command's side: how often is required; the step comes from the
    prediction, or for state in RAM from a RAM run's own step (forward + backward and its
    optimizer, none counted as 0 s); the copy's read rate is the prediction's bandwidth,
    only with the state on NVMe; the checkpoint drives' derating is their own datasheet's."""
    from iotune.model.presets import preset_with
    from iotune.plan.ckplan import plan_for_estimate
    from iotune.plan.measured import Bandwidth, Baseline
    from iotune.plan.predict import Prediction

    kw: dict[str, Any] = {
        "drive": None, "checkpoint_drive": "samsung-980-pro-2tb", "level": 6, "share": "5%",
        "sweep": None,
    }  # fmt: skip
    ram, nvme = preset_with("opt_ram_1b", ()), preset_with("opt_nvme_1b", ())
    with pytest.raises(UsageError, match="--checkpoint-every says how often") as err:
        plan_for_estimate(ram, None, None, None, None, save_bytes=GB, every=None, **kw)
    assert str(err.value) == (
        "--checkpoint-sweep plans checkpoints, and --checkpoint-every says how often"
    )
    assert err.value.hint == "--checkpoint-every 100 --checkpoint-sweep RUN"
    run = Baseline(10.0, 2.5, "a RAM run")
    got = plan_for_estimate(ram, None, None, None, run, save_bytes=GB, every=10, **kw)
    assert (got["step_s"], got["offload_read_bytes_s"]) == (12.5, None)
    assert got["write_derate"] == pytest.approx(0.74)  # the published ratio: no measure
    assert got["writers_note"].startswith("each writer: --checkpoint-sweep RUN")
    bare = Baseline(10.0, None, "a GPU run")
    got = plan_for_estimate(ram, None, None, None, bare, save_bytes=GB, every=10, **kw)
    assert got["step_s"] == 10.0
    # the state on NVMe: a RAM run's step is not its step, the prediction's is
    bw = Bandwidth(3 * GB, 2 * GB, {}, {}, "a sweep")
    pred = Prediction(5.0, 20.0)
    got = plan_for_estimate(nvme, None, pred, bw, run, save_bytes=GB, every=10, **kw)
    assert (got["step_s"], got["offload_read_bytes_s"]) == (20.0, 3 * GB)
    assert "shutil.copytree" in got["writers_note"]
    with pytest.raises(UsageError, match="nothing given predicts"):
        plan_for_estimate(nvme, None, None, bw, run, save_bytes=GB, every=10, **kw)
    # a sweep alone, no datasheet: no derating of drives it does not describe
    sweep = Path(__file__).resolve().parents[2] / "benchmarks/results/gpu-ckpt-sweep-h100/ckpt"
    alone = {**kw, "checkpoint_drive": None, "sweep": str(sweep)}
    got = plan_for_estimate(ram, None, None, None, run, save_bytes=GB, every=10, **alone)
    assert (got["drive"], got["write_derate"], got["plans"]) == (None, None, [])


def _copy_sweep(tmp_path: Path) -> dict[str, Any]:
    """A copy sweep's result as sweep-checkpoint --copy-from writes it (summarize() of its
    records), 3 rounds of 1 GiB copies, in tmp_path/copy.json."""
    from iotune.sweep.copysweep import COPY_RESULT, summarize

    aio = {"block_size": 1 << 20, "queue_depth": 32, "intra_op_parallelism": 4}
    times = {  # (blocked, durable) a round
        "ceiling": [(1.3, 1.3), (1.4, 1.4), (1.5, 1.5)],
        "deepspeed": [(1.9, 3.1), (2.0, 3.0), (2.2, 2.9)],
        "aio": [(1.6, 1.6), (1.5, 1.5), (1.4, 1.4)],
        "reflink": [(0.01, 0.02), (0.01, 0.02), (0.03, 0.04)],
    }
    records = [
        {
            "copy": copy,
            "settings": aio if copy == "aio" else None,
            "round": r,
            "status": "ok",
            "bytes": 1 << 30,
            "blocked_s": b,
            "durable_s": d,
        }
        for copy, per in times.items()
        for r, (b, d) in enumerate(per)
    ]
    doc = {
        **summarize(records),
        "bytes": 1 << 30,
        "copy_from": "/off",
        "target": "/ck",
        "out": str(tmp_path),
    }
    (tmp_path / COPY_RESULT).write_text(json.dumps(doc))
    return doc


def test_each_copy_of_the_swap_files_scaled_from_the_copy_sweep(tmp_path: Path) -> None:
    from iotune.plan.cksweeps import copy_rows

    rows = copy_rows(10 * 2**30, 10, 2.0, _copy_sweep(tmp_path))
    by = {r["copy"]: r for r in rows}
    assert list(by) == ["deepspeed", "aio", "reflink", "ceiling"]
    # the medians of the rounds x 10 (a save of 10 GiB against copies of 1 GiB); the step
    # waits for the copy's return, a save every 10 steps of 2 s
    assert (by["deepspeed"]["waits_s"], by["deepspeed"]["durable_s"]) == (20.0, 30.0)
    assert by["deepspeed"]["share"] == pytest.approx(20 / 40, abs=1e-4)
    assert by["aio"]["waits_s"] == by["aio"]["durable_s"] == 15.0
    assert by["aio"]["share"] == pytest.approx(15 / 35, abs=1e-4)
    assert "aio 1 MiB qd 32 x4" in by["aio"]["how"] and "--checkpoint-copy aio" in by["aio"]["how"]
    assert (by["reflink"]["waits_s"], by["reflink"]["durable_s"]) == (0.1, 0.2)
    assert by["ceiling"]["waits_s"] == 14.0


def test_the_plan_of_nvme_offloaded_state_takes_the_copy_sweep(tmp_path: Path) -> None:
    sweep = _copy_sweep(tmp_path)
    ck = checkpoint_plan(10 * 2**30, True, None, 2.0, None, None, 10, 6, 0.45, sweep)
    assert [c["copy"] for c in ck["copies"]] == ["deepspeed", "aio", "reflink", "ceiling"]
    assert ck["writers"] == [] and ck["writers_note"] is None
    assert ck["copies_volumes"] == "/off to /ck"
    # deepspeed's 50% is over the 45% asked; aio's 42.9% and reflink's are under; the ceiling
    # is no copy a run makes
    assert ck["answer"] == (
        "between the swept volumes, the aio and reflink copies keep a save every 10 step(s) "
        "under 45% of the training"
    )
    ck = checkpoint_plan(10 * 2**30, True, None, 2.0, None, None, 10, 6, 0.001, sweep)
    assert ck["answer"].startswith("no copy keeps a save every 10 step(s) under 0.1%")
    # state in host memory has no swap files to copy: one line
    with pytest.raises(UsageError, match="optimizer is in host memory"):
        checkpoint_plan(10 * 2**30, False, None, 2.0, None, None, 10, 6, 0.45, sweep)


def test_estimate_plans_each_copy_from_a_copy_sweeps_run(tmp_path: Path) -> None:
    sweep = _copy_sweep(tmp_path)
    ck, _ = _ckplan("--checkpoint-sweep", str(tmp_path))
    by = {c["copy"]: c for c in ck["copies"]}
    # opt_nvme_1b's save (12 bytes a parameter of the model's swap files) over the 1 GiB swept
    scale = ck["save_bytes"] / 2**30
    assert ck["save_bytes"] > 14e9
    rows = {r["point"]: r for r in sweep["rows"]}
    assert by["deepspeed"]["waits_s"] == pytest.approx(
        rows["deepspeed"]["blocked_s"] * scale, abs=1e-3
    )
    assert by["aio"]["durable_s"] == pytest.approx(1.5 * scale, abs=1e-3)
    interval = 10 * ck["step_s"]
    assert by["aio"]["share"] == pytest.approx(
        by["aio"]["waits_s"] / (interval + by["aio"]["waits_s"]), abs=1e-4
    )
    # the table on screen
    args = ["estimate", "opt_nvme_1b", "--baseline", str(RUN_1B), "--aio-config", str(SWEEP)]
    args += [
        "--threads-config",
        str(THREADS),
        "--checkpoint-every",
        "10",
        "--checkpoint-sweep",
        str(tmp_path / "copy.json"),
    ]
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune")
    assert r.exit_code == 0, r.output
    assert "each copy of the swap files, a save every 10 step(s), /off to /ck" in r.output
    assert f"{by['aio']['waits_s']:.2f}" in r.output
    # a model whose optimizer is in host memory, and a sweep whose copies all failed
    bad = ["estimate", "opt_ram_1b", "--baseline", str(RUN_1B.parent / "opt_ram_1b")]
    rb = CliRunner().invoke(
        cli_mod.cli, [*bad, "--checkpoint-every", "10", "--checkpoint-sweep", str(tmp_path)]
    )
    assert rb.exit_code == 2 and "optimizer is in host memory" in rb.output, rb.output
    (tmp_path / "copy.json").write_text(json.dumps({**sweep, "rows": []}))
    rb = CliRunner().invoke(cli_mod.cli, args)
    assert rb.exit_code == 2 and "has no copy that ended" in rb.output, rb.output
    (tmp_path / "copy.json").write_text("{")
    rb = CliRunner().invoke(cli_mod.cli, args)
    assert rb.exit_code == 2 and "copy.json is not a copy sweep's result: " in rb.output, rb.output
