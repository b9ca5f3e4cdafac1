"""The drives planner (`iotune estimate --drives`): a RAID0 of K drives like a swept one, one
a run swapped to, or one a datasheet describes; every bound of the step reached by a
constructed case; endurance; from pure logic and the recorded H100 sweep."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune.errors import UsageError
from iotune.model.dsconfig import ds_config
from iotune.model.estimate import estimate
from iotune.model.presets import get_preset, preset_with
from iotune.plan.datasheet import DriveSpec, link_bandwidth, load_profiles, parse_drive
from iotune.plan.drives import (
    DAY_S,
    DriveInputs,
    DrivePlan,
    Limit,
    Raid,
    parse_target,
    plan_drives,
    smallest_for,
)
from iotune.plan.measured import (
    AdamRate,
    Bandwidth,
    Baseline,
    run_baseline,
    run_drives,
    study_inputs,
)
from iotune.units import GIB

DATA = Path(__file__).resolve().parent.parent / "data" / "study-h100"
ONE = Bandwidth(2 * GIB, 3 * GIB, {}, {"read": 3, "write": 3}, "sweep")
ADAM = AdamRate(1e-9, 2, 10**9, "threads")  # 1 ns a parameter
BASE = Baseline(4.0, None, "opt_ram run", backward_s=3.0)
P1B = get_preset("opt_nvme_1b")
E1B = estimate(P1B, ds_config(P1B))


def _plans(drives: list[int], **kw: Any) -> list[DrivePlan]:
    return plan_drives(P1B, E1B, DriveInputs(ONE, **kw), ADAM, BASE, drives)


def test_pcie_links_as_sysfs_writes_them() -> None:
    assert link_bandwidth("16.0 GT/s PCIe x4") == pytest.approx(4 * 1.969e9)
    assert link_bandwidth("32.0 GT/s x16") == pytest.approx(16 * 3.938e9)
    assert link_bandwidth("16GT/s x4") == pytest.approx(4 * 1.969e9)
    assert link_bandwidth("Unknown x0") is None and link_bandwidth(None) is None


def test_k_drives_divide_the_swaps_and_nothing_else() -> None:
    one, two, four = _plans([1, 2, 4])
    assert (two.read_bw, two.write_bw) == (2 * ONE.read, 2 * ONE.write)
    assert one.bound_by == two.bound_by == "drives" == one.step_bound
    assert one.io_s is not None and two.io_s is not None and four.io_s is not None
    # the swaps halve with twice the drives (the gradients' write hides behind backward)
    assert two.io_s == pytest.approx(one.io_s / 2, rel=0.02)
    # forward + backward and CPU Adam do not change
    assert one.compute_s == two.compute_s == four.compute_s
    s1, s4 = one.prediction.step_s, four.prediction.step_s
    assert s1 is not None and s4 is not None and s4 < s1
    # 1B: 18.4 GiB read and 13.8 GiB written a step: drive-bound on one drive, not on many
    assert one.drive_bound and not _plans([64])[0].drive_bound


def test_every_bound_of_the_step_is_named_where_it_binds() -> None:
    """The drives, their PCIe link, the array's chunk, an exhausted SLC cache, host memory,
    CPU Adam and forward + backward: each a constructed case where it is the tightest."""
    link = Limit("PCIe link", 1 * GIB, "B/s", "sysfs")
    (capped,) = _plans([4], link=link)
    assert capped.bound_by == "PCIe link" and capped.read_bw == 4 * GIB
    mem = Limit("host memory", 5 * GIB, "B/s", "--memory-bw")
    (m,) = _plans([8], memory=mem)
    assert m.bound_by == "memory" and m.read_bw == m.write_bw == 5 * GIB
    # 2 requests of 512 KiB in flight over 512 KiB chunks: two members work at once
    raid = Raid(512 << 10, 512 << 10, 2, 1, "test")
    two, eight = _plans([2, 8], raid=raid)
    assert raid.busy == 2 and two.bound_by == "drives"
    assert eight.bound_by == "RAID0 chunk" and eight.read_bw == 2 * ONE.read
    # a 4 MiB block split over 512 KiB chunks keeps 8 members busy with one request
    assert Raid(512 << 10, 4 << 20, 1, 1, "test").busy == 8
    # the SLC cache: 1B writes 18.4 GiB a step; one drive's 5 GB cache is exceeded
    spec = DriveSpec("t", "t", 3e9, 3e9, capacity=2e12, cache=5e9, after_cache=0.5e9)
    one, eight = _plans([1, 8], spec=spec)
    assert one.bound_by == "read: drives, write: SLC cache" and one.write_bw < ONE.write
    w = E1B.steady_step.write
    assert one.write_bw == pytest.approx(w / spec.write_seconds(w, ONE.write))
    # 8 drives: 2.3 GiB a drive a step, within the cache
    assert eight.bound_by == "drives" and eight.write_bw == 8 * ONE.write
    big = DriveSpec("t", "t", 3e9, 3e9, capacity=2e12, cache=50e9, after_cache=0.5e9)
    (roomy,) = _plans([1], spec=big)
    assert roomy.bound_by == "drives" and roomy.write_bw == ONE.write
    # CPU Adam: a slow one (1 us a parameter) outweighs the swaps of 64 drives
    slow = plan_drives(P1B, E1B, DriveInputs(ONE), AdamRate(1e-6, 2, 10**9, "t"), BASE, [64])[0]
    assert slow.step_bound == "CPU Adam"
    # forward + backward: a long one on many drives
    long = plan_drives(P1B, E1B, DriveInputs(ONE), ADAM, Baseline(500.0, None, "b", 3.0), [64])[0]
    assert long.step_bound == "forward + backward"


def test_endurance_each_drive_writes_its_share_against_the_rated_writes() -> None:
    spec = DriveSpec("t", "t", 3e9, 3e9, capacity=2e12, tbw=1200e12)
    one, four = _plans([1, 4], spec=spec)
    assert one.endurance is not None and four.endurance is not None
    assert four.endurance.per_drive_step == E1B.steady_step.write / 4
    step = four.prediction.step_s
    assert step is not None
    per_day = E1B.steady_step.write / 4 * DAY_S / step
    assert four.endurance.per_day == pytest.approx(per_day)
    assert four.endurance.dwpd == pytest.approx(per_day / 2e12)
    assert four.endurance.days == pytest.approx(1200e12 / per_day)
    # a rating in DWPD over the warranty's years
    dc = DriveSpec("d", "d", 3e9, 3e9, capacity=3.84e12, dwpd=1.0, warranty_years=5)
    assert dc.rated_writes == pytest.approx(3.84e12 * 365 * 5)
    # no rating: the writes, no days
    (bare,) = _plans([1])
    assert bare.endurance is not None and bare.endurance.days is None


def test_target_step_answers_with_the_fewest_drives_or_why_none() -> None:
    inputs = DriveInputs(ONE)
    steps = {pl.drives: pl.prediction.step_s for pl in _plans([1, 2, 3, 4])}
    assert steps[2] is not None and steps[3] is not None
    k, why, _ = smallest_for(P1B, E1B, inputs, ADAM, BASE, (steps[2] + steps[3]) / 2)
    assert k == 3 and why.startswith("3 drive(s)")
    assert "more drives approach the step without drive waits" in why
    # below forward + backward + Adam no number of drives helps
    k, why, _ = smallest_for(P1B, E1B, inputs, ADAM, BASE, 3.0)
    assert k is None and "without any wait on the drives the step is still" in why
    k, why, _ = smallest_for(P1B, E1B, inputs, ADAM, None, 10.0)
    assert k is None and "--baseline" in why
    # relative to the step without drive waits: 4 s forward + backward, 1.24 s Adam
    k, why, target_s = smallest_for(P1B, E1B, inputs, ADAM, BASE, 2.0, relative=True)
    floor = _plans([64])[0].compute_s
    assert floor is not None and target_s == pytest.approx(2 * floor)
    assert k is not None and "2 x the" in why
    # an array whose chunk caps the members: what stops more drives is named
    capped = DriveInputs(ONE, raid=Raid(512 << 10, 512 << 10, 2, 1, "test"))
    k, why, _ = smallest_for(P1B, E1B, capped, ADAM, BASE, 1.2, relative=True)
    assert k is None and "from 3 drives on, RAID0 chunk caps the swaps" in why


@pytest.mark.parametrize(
    ("text", "want"), [("60", (60.0, False)), ("1.5x", (1.5, True)), (" 2X ", (2.0, True))]
)
def test_target_steps_in_seconds_or_multiples(text: str, want: tuple[float, bool]) -> None:
    assert parse_target(text) == want


@pytest.mark.parametrize("text", ["-1", "0", "fast", "0.5x", "nanx", "inf"])
def test_bad_target_steps(text: str) -> None:
    with pytest.raises(UsageError):
        parse_target(text)


# ------------------------------------------------------------------------ datasheets


def test_a_datasheet_as_keys_in_the_makers_units() -> None:
    d = parse_drive("read=7.0GB/s,write=5100MB/s,link=16GT/s x4,capacity=2TB,tbw=1200TB")
    assert (d.read, d.write) == (7.0e9, 5.1e9)
    assert d.capacity == 2e12 and d.tbw == 1200e12 and d.rated_writes == 1200e12
    assert d.link == "16GT/s x4" and d.label == "--drive"
    q = parse_drive("read=2MiB/s,write=2MiB/s")
    assert (q.read, q.write) == (2 * 2**20, 2 * 2**20) and q.tbw is None
    c = parse_drive("read=4GB/s, write=4GB/s, capacity=1TB, cache=341GB, after_cache=450MB/s")
    assert c.cache == 341e9 and c.after_cache == 450e6
    # past the cache at the sustained rate
    assert c.write_seconds(441e9, 4e9) == pytest.approx(341e9 / 4e9 + 100e9 / 450e6)
    assert c.write_seconds(100e9, 4e9) == pytest.approx(100e9 / 4e9)


def test_the_profile_table_holds_real_drives_with_their_sources() -> None:
    profiles, derate = load_profiles()
    assert {"samsung-980-pro-2tb", "wd-black-sn770-2tb", "samsung-pm9a3-3.84tb"} <= set(profiles)
    # the study's class, and a DRAM-less one, and data-centre Gen4 and Gen5 drives
    s980 = profiles["samsung-980-pro-2tb"]
    assert (s980.read, s980.write, s980.tbw, s980.capacity) == (7.0e9, 5.1e9, 1200e12, 2e12)
    assert any(p.dram is False for p in profiles.values())
    assert any(link_bandwidth(p.link) == pytest.approx(4 * 3.938e9) for p in profiles.values())
    for p in profiles.values():
        assert p.source.startswith(("http", "Samsung", "Micron", "reseller", "sequential")), p
        assert p.read > 0 and p.write > 0 and p.capacity
    assert 0 < derate.read < 1 and 0 < derate.write < 1
    assert "DeepNVMe" in derate.source
    # a profile, then keys that change it
    small = parse_drive("samsung-980-pro-2tb,capacity=1TB")
    assert small.capacity == 1e12 and small.read == s980.read


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no-such-drive", "is no drive profile"),
        ("write=5GB/s", "needs a sequential read rate"),
        ("capacity=2TB", "needs a sequential read and write rate"),
        ("read=-1GB/s,write=1GB/s", "must be positive"),
        ("read=0GB/s,write=1GB/s", "must be positive"),
        ("read=7000GB/s,write=1GB/s", "is not a drive's rate"),
        ("read=7GB/s,write=5GB/s,dwpd=1", "without the drive's capacity"),
        ("read=7GB/s,write=5GB/s,capacity=2PB", "is not a drive's figure"),
        ("read=7GB/s,write=5GB/s,speed=9", "has no key 'speed'"),
        ("read=7GB/s,write=5GB/s,link=fast", "is not a PCIe link"),
        ("read=7,write=5", "has no unit"),
        ("read=7GB/s,write5GB/s", "is not KEY=VALUE"),
    ],
)
def test_bad_datasheets_are_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_drive(text)
    assert message in e.value.message and e.value.hint


# ------------------------------------------------------------------------ baselines


def _nvme_run(**step: float) -> dict[str, Any]:
    """A run document of the optimizer state on NVMe, 1B, two drives, with swap timings."""
    est = json.loads(json.dumps({"swapped": {"n_s": E1B.swapped.n_s, "n_g": E1B.swapped.n_g}}))
    est["steady_step"] = {"read": E1B.steady_step.read, "write": E1B.steady_step.write}
    ev = {"event": "step", "forward_s": 1.0, "backward_s": 2.0, "accumulate_s": 0.0}
    ev.update({"optimizer_s": 20.0, "grad_out_s": 1.0, "swap_in_s": 9.0, "grad_flush_s": 1.0})
    ev.update({"swap_out_s": 6.0, **step})
    return {
        "preset": "opt_nvme_1b",
        "strategy": "opt_nvme",
        "ranks": 1,
        "drives": ["nvme0n1", "nvme1n1"],
        "estimate": est,
        "events": [{"event": "init"}, dict(ev, step=1), dict(ev, step=2), dict(ev, step=3)],
    }


def test_an_nvme_run_gives_its_drives_cpu_adam_and_forward_backward() -> None:
    doc = _nvme_run()
    base = run_baseline(doc, "RUN")
    assert base.kind == "nvme" and base.forward_backward_s == 3.0
    # 20 s of optimizer step less 1 + 9 + 6 s of swaps
    assert base.optimizer_s == 4.0 and base.backward_s == 0.0
    drives = run_drives(doc, "RUN")
    assert drives is not None and drives.drives == 2
    moved = 12 * E1B.swapped.n_s + 4 * E1B.swapped.n_g
    assert drives.read == pytest.approx(moved / 8.0)  # swap_in less its wait for gradients
    assert drives.write == pytest.approx(moved / 8.0)  # 1 + 1 + 6 s
    one = drives.per_drive()
    assert one.read == drives.read / 2 and one.pattern == "run"
    # at the run's own drive count the plan gives back the run's step
    (two,) = plan_drives(P1B, E1B, DriveInputs(one), None, base, [2])
    assert two.prediction.step_s == pytest.approx(3.0 + 20.0, rel=0.01)


def test_runs_without_swap_timings_or_swaps_are_baselines_of_what_they_tell() -> None:
    old = _nvme_run()
    for e in old["events"]:
        for k in ("grad_out_s", "swap_in_s", "grad_flush_s", "swap_out_s"):
            e.pop(k, None)
    base = run_baseline(old, "OLD")
    assert base.optimizer_s is None and run_drives(old, "OLD") is None
    ram = {**_nvme_run(), "preset": "opt_ram_1b", "strategy": "opt_ram"}
    assert run_baseline(ram, "RAM").optimizer_s == 20.0
    gpu = {**_nvme_run(), "preset": "gpu_baseline_1b", "strategy": "gpu_baseline"}
    g = run_baseline(gpu, "GPU")
    assert g.kind == "gpu" and g.optimizer_s is None and g.forward_backward_s == 3.0


def test_the_studys_own_figures_for_its_16b_model() -> None:
    p = preset_with("opt_nvme_16b", ("model.num_hidden_layers=60",))
    got = study_inputs(p)
    assert got is not None
    base, adam = got
    assert base.forward_backward_s == pytest.approx(107.71 - 97.66)
    # its 2B's 1096.52 ms at 6 threads, per parameter of iotune's 2B preset
    n2 = get_preset("opt_ram_2b").geometry.param_count()
    assert adam.threads == 6 and adam.seconds_per_param == pytest.approx(1.09652 / n2)
    # parameters on NVMe: forward + backward of the optimizer-only row (the same model)
    q = preset_with("params_opt_nvme_16b", ("model.num_hidden_layers=60",))
    got_q = study_inputs(q)
    assert got_q is not None and got_q[0].forward_backward_s == base.forward_backward_s
    assert study_inputs(get_preset("opt_nvme_1b")) is None


# ------------------------------------------------------------------------ the command


def _estimate(*args: str) -> Any:
    return CliRunner().invoke(cli_mod.cli, ["estimate", *args], prog_name="iotune")


def test_estimate_drives_cli_with_the_recorded_h100_sweep() -> None:
    args = ["--json", "estimate", "opt_nvme_1b", "--aio-config", str(DATA / "sweep-aio")]
    args += ["--threads-config", str(DATA / "threads"), "--drives", "4,1,2"]
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)["drives"]
    assert [p["drives"] for p in doc["plans"]] == [1, 2, 4]
    opt = [p["optimizer_s"] for p in doc["plans"]]
    assert opt[0] > opt[1] > opt[2]
    texts = [lim["text"] for lim in doc["limits"]]
    assert any(t.startswith("one drive, read (measured): 2.05 GiB/s") for t in texts), texts
    assert any(t.startswith("CPU Adam") for t in texts)
    r = CliRunner().invoke(cli_mod.cli, [*args[1:], "--link", "16.0 GT/s x4"], prog_name="iotune")
    assert r.exit_code == 0 and "PCIe link 16.0 GT/s x4 per drive: 7.34 GiB/s (--link)" in r.stdout
    # the datasheet beside the sweep: the sweep stays, the derating it measured is shown
    r = CliRunner().invoke(
        cli_mod.cli, [*args, "--drive", "read=4GB/s,write=4GB/s"], prog_name="iotune"
    )
    plan = json.loads(r.stdout)["drives"]
    assert (
        plan["derate"]["measured"]
        and plan["plans"][0]["read_bw_bytes_s"] == doc["plans"][0]["read_bw_bytes_s"]
    )
    assert plan["derate"]["read"] == pytest.approx(doc["plans"][0]["read_bw_bytes_s"] / 4e9)


def test_the_studys_question_from_a_datasheet_and_its_own_figures() -> None:
    """No sweep, no RAM run: the study's drive class from the profile table and the study's
    own step for forward + backward and CPU Adam; its measured steps beside the plan's."""
    r = CliRunner().invoke(
        cli_mod.cli,
        [
            "--json",
            "estimate",
            "opt_nvme_16b",
            *("--set", "model.num_hidden_layers=60", "--set", "ds.aio.queue_depth=16"),
            *("--drive", "samsung-980-pro-2tb", "--baseline", "study"),
            *("--drives", "1,3,10", "--target-step", "1.5x"),
        ],
        prog_name="iotune",
    )
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)["drives"]
    by = {p["drives"]: p for p in plan["plans"]}
    assert by[1]["study_step_s"] == 107.71 and by[3]["study_step_s"] == 49.66
    assert by[10]["study_step_s"] is None
    for k in (1, 3):
        assert abs(by[k]["step_s"] - by[k]["study_step_s"]) <= 0.15 * by[k]["study_step_s"]
    assert plan["derate"]["measured"] is False and plan["baseline"]["kind"] == "study"
    assert plan["target"]["drives"] == 10
    assert by[1]["endurance"]["days_to_rated_writes"] > 0
    texts = [lim["text"] for lim in plan["limits"]]
    assert all(not t.startswith("one drive") or "(datasheet)" in t for t in texts), texts
    text = CliRunner().invoke(
        cli_mod.cli,
        ["estimate", "opt_nvme_16b", "--drive", "samsung-980-pro-2tb", "--baseline", "study"],
        prog_name="iotune",
    )
    assert "described by samsung-980-pro-2tb's datasheet" in text.stdout
    assert "DAYS TO TBW" in text.stdout and "(datasheet)" in text.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--drives", "two"], "--drives 'two' is not a list of drive counts"),
        (["--drives", "0,2"], "is not a list of drive counts"),
        (["--drives", "2", "--link", "fast"], "--link 'fast' is not a PCIe link"),
        (["--target-step", "-1", "--drives", "1"], "--target-step must be positive"),
        (["--drives", "2", "--memory-bw", "0"], "--memory-bw must be the host's memory"),
        (["--drives", "2", "--chunk", "big"], "--chunk 'big' is not a size"),
        (["--drive", "nope"], "is no drive profile"),
    ],
)
def test_bad_plans_get_one_line_and_a_hint(extra: list[str], message: str) -> None:
    r = _estimate("opt_nvme_1b", "--aio-config", str(DATA / "sweep-aio"), *extra)
    assert r.exit_code == 2 and message in r.stderr and "hint:" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 2 and "Traceback" not in r.stderr


def test_drives_need_one_drives_bandwidth() -> None:
    r = _estimate("opt_nvme_1b", "--drives", "2")
    assert r.exit_code == 2 and "--drives plans from one drive's bandwidth" in r.stderr
    r = _estimate("opt_nvme_1b", "--baseline", "study", "--drive", "samsung-980-pro-2tb")
    assert r.exit_code == 2 and "the study measured no step of opt_nvme_1b" in r.stderr


def test_a_baseline_that_is_no_run_is_one_line(tmp_path: Path) -> None:
    r = _estimate("opt_nvme_1b", "--drive", "samsung-980-pro-2tb", "--baseline", str(tmp_path))
    assert r.exit_code == 2 and "not an iotune run" in r.stderr, r.stderr


def test_replace_keeps_a_profiles_source() -> None:
    s = parse_drive("samsung-980-pro-2tb")
    assert replace(s, capacity=1e12).source == s.source


def test_a_run_of_one_step_is_no_baseline_as_it_has_no_steady_row() -> None:
    """The run's table has no steady-step row for a run of one step; its baseline reader
    (iotune.plan.rundoc.later_steps) says the same instead of timing the first step."""
    doc = _nvme_run()
    doc["events"] = doc["events"][:2]
    with pytest.raises(UsageError, match="no steady step"):
        run_baseline(doc, "ONE")


def test_gradients_written_at_the_end_of_backward_are_the_drives_not_the_compute() -> None:
    """DeepSpeed's managed accumulation writes the gradients at the end of the last backward
    (seen on an H100): that second is the drives' (backward_grad_out_s), not forward +
    backward's, and not the optimizer step's."""
    doc = _nvme_run(grad_out_s=0.0, backward_grad_out_s=1.0)
    base = run_baseline(doc, "RUN")
    assert base.forward_backward_s == 2.0 and base.optimizer_s == 5.0
    drives = run_drives(doc, "RUN")
    assert drives is not None
    moved = 12 * E1B.swapped.n_s + 4 * E1B.swapped.n_g
    assert drives.write == pytest.approx(moved / 8.0)
    assert "without the gradients' writes" in base.source
