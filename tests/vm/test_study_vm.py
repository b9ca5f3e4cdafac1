"""The study on RAID0 end to end, with the real programs in a guest of its own: `iotune raid
create` (RAID0 over 2 and over 4 drives, one drive kept single), `iotune sweep-aio` with
DeepSpeed's swapping pattern on each volume, `iotune study` of the two NVMe strategies over
the three volumes (ZeRO-3 training traced per member), `iotune report`, and the drives
planner (`iotune estimate --drives`) from the single drive's sweep.

Every drive is throttled to the same bandwidth (the guest's block layer: Guest.throttle),
so a RAID0 of K drives is K times one drive, and the CPU presets' steps wait on their
drives. The guest's CPU is emulated (TCG): its forward, backward and CPU Adam are slow, so
the model is cut (``--set``) to one small layer, a small vocabulary and two tokens (1.8M
parameters, about 25 MiB swapped each way per step), and the drives to 2 MiB/s, so that
waiting on the drives is most of the step on one, two and four drives. The sweeps rehearse
that same model's swapping.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from iotune.plan.rundoc import swap_medians
from tests.io_rules import param_reads_shift_ok
from tests.vm.study_lab import (
    BIN,
    SETS,
    STEPS,
    STRATEGIES,
    VOLUMES,
    Lab,
    LabRuns,
    LostMember,
    ram_run,
    runs_by_volume,
)

#: what writes move beyond DeepSpeed's files: xfs's log and metadata (tens of KiB a step)
FS_WRITES = 1024 * 1024


@pytest.fixture(scope="module")
def sweeps(lab_runs: LabRuns) -> dict[str, dict[str, Any]]:
    return lab_runs.sweeps


@pytest.fixture(scope="module")
def study(lab_runs: LabRuns) -> dict[str, Any]:
    return lab_runs.study


def _baseline(study: dict[str, Any]) -> dict[str, Any]:
    ram = ram_run(study)
    assert ram["status"] == "ok", ram
    return ram


def _run_json(r: dict[str, Any]) -> dict[str, Any]:
    return dict(json.loads((Path(r["run_dir"]) / "run.json").read_text()))


def _swept(sweep: dict[str, Any]) -> float:
    """A volume's bandwidth in DeepSpeed's swapping pattern: bytes read and written per
    second of the rehearsal (reads and writes take turns, as in the optimizer step)."""
    r = sweep["swap"]
    assert r["status"] == "ok", r
    rd, wr = r["read_bytes"], r["write_bytes"]
    return float((rd + wr) / (rd / r["read_bw_bytes_s"] + wr / r["write_bw_bytes_s"]))


def test_every_run_finished_on_its_volume(study: dict[str, Any], lab: Lab) -> None:
    _baseline(study)
    for s in STRATEGIES:
        runs = runs_by_volume(study, s)
        assert sorted(runs) == sorted(VOLUMES), (s, sorted(runs))
        for name, r in runs.items():
            assert r["status"] == "ok", (s, name, r.get("error"))
            assert r["steps_done"] == STEPS
            v = r["volume"]
            want = sorted(lab.names[x] for x in VOLUMES[name])
            assert sorted(v["drives"]) == want, (name, v)
            assert v["members"] == len(want)
            assert v["level"] == (None if len(want) == 1 else "raid0")
            if v["level"]:
                assert v["chunk_bytes"] == 512 * 1024
            # on torch's baseline kernels, as the lab's environment asks (guest_ops.TORCH_ENV)
            ready = json.loads(Path(r["run_dir"], "steps.jsonl").read_text().splitlines()[0])
            assert ready["event"] == "ready" and ready["cpu"]["cpu_capability"] == "DEFAULT"


def _members_timed(name: str, doc: dict[str, Any], members: list[str]) -> None:
    """Each member of an array, each steady step: its requests timed (the reads and writes it
    was issued, but for one in flight at a step's edge, timed in the step it completes in;
    p50 and p99 at the member) and its own depth, time-weighted (Little's law) and as each
    issue found it, beside the kernel's time_in_queue mean."""
    for step in doc["io_steps"][2:]:
        for m in members:
            lat = step["drives"][m]["latency"]
            for op in ("read", "write"):
                sizes = step["drives"][m][f"{op}_sizes"]
                issued = sum(sizes.values())
                assert abs(lat[op]["requests"] - issued) <= max(4, issued // 50), (name, m, op)
                assert 0 < lat[op]["p50_us"] <= lat[op]["p99_us"], (name, m, op, lat[op])
            depth = lat["depth"]
            assert depth["at_issue"]["max"] >= 1 and depth["mean"] > 0, (name, m, depth)
            assert depth["kernel_mean"] >= 0.9 * depth["mean"] - 0.01, (name, m, depth)


def test_arrays_move_the_model_exactly_spread_over_their_members(study: dict[str, Any]) -> None:
    """Every steady step moves the I/O model's bytes, summed over the members (reads to the
    byte, or with parameter offload to whole parameter files as on one drive; writes up
    to the filesystem's own), each member within 5% of its share of the model's bytes (and
    of the parameter files a step shifted)."""
    for s in STRATEGIES:
        for name, r in runs_by_volume(study, s).items():
            doc = _run_json(r)
            est = doc["estimate"]["steady_step"]
            members = doc["drives"]
            assert len(members) == len(VOLUMES[name]), (name, members)
            for step in doc["io_steps"][2:]:  # init, the first step, then the steady ones
                per = step["drives"]
                assert sorted(per) == sorted(members), (name, step["label"])
                rd = sum(per[m]["read"] for m in members)
                wr = sum(per[m]["write"] for m in members)
                if s == "opt_nvme":
                    assert rd == est["read"], (s, name, step["label"], rd, est["read"])
                else:  # whole parameter files may shift between steps, as on one drive
                    n_p = doc["estimate"]["swapped"]["n_p"]
                    assert param_reads_shift_ok(rd - est["read"], n_p), (s, name, rd, est)
                assert 0 <= wr - est["write"] <= FS_WRITES, (s, name, step["label"], wr)
                for m in members:
                    for op, total in (("read", rd), ("write", wr)):
                        # the model's bytes spread evenly; whole parameter files shifted in
                        # or out of a step land on the members their stripes are on (seen:
                        # 2 MiB more read, 1 MiB more on each of 2 of 4 members), and the
                        # filesystem's own writes (its journal) on the member its blocks are
                        # on (seen: 402 KiB more on one of 4)
                        shifted = abs(total - est[op])
                        even = est[op] / len(members)
                        off = per[m][op] - even
                        assert abs(off) <= 0.05 * even + shifted, (s, name, m, op, off, even)
            _members_timed(name, doc, members)
            # the trace's cross-check against the kernel's own counters, per member
            trace = json.loads((Path(r["run_dir"]) / "trace.json").read_text())
            for d in trace["devices"]:
                if d["name"] in members:
                    chk = d["check"]
                    assert chk["exact"] or chk["summary"].startswith("consistent: "), (name, chk)


@pytest.fixture(scope="module")
def plans(lab_runs: LabRuns) -> dict[str, dict[int, dict[str, Any]]]:
    """The planner's answer per strategy for 1, 2 and 4 drives (study_lab.plans_of)."""
    return lab_runs.plans


def test_the_sweeps_rehearse_the_runs_swapping(
    study: dict[str, Any], sweeps: dict[str, dict[str, Any]]
) -> None:
    """Each volume's rehearsal swapped the files of the model the study runs (the --set
    values carried, the bytes per step those of the run, to DeepSpeed's padding)."""
    for name in VOLUMES:
        r = sweeps[name]["swap"]
        assert r["status"] == "ok" and r["sets"] == list(SETS), r
        run = runs_by_volume(study, "opt_nvme")[name]
        want = _run_json(run)["estimate"]["steady_step"]["read"]
        assert abs(r["read_bytes"] - want) <= 0.01 * want, (name, r["read_bytes"], want)


def _drive_phases(r: dict[str, Any]) -> float:
    """The seconds a run's steady step spent in DeepSpeed's optimizer swapper, median over
    the steps after the first, as iotune's SwapClock timed them: the gradients written and
    flushed, the state read in and written out (swap_in_s holds the flush's wait)."""
    sm = swap_medians(_run_json(r))
    assert sm is not None, r["run_dir"]
    return sm["grad_out_s"] + sm["backward_grad_out_s"] + sm["swap_in_s"] + sm["swap_out_s"]


def test_the_step_shrinks_with_the_drives(
    study: dict[str, Any],
    sweeps: dict[str, dict[str, Any]],
    plans: dict[str, dict[int, dict[str, Any]]],
) -> None:
    """More drives, a shorter step: on 2 and 4 drives the step is shorter than on one, and
    the part of it spent on the drives (the optimizer swapper's phases, timed in the run)
    is shorter by at least 0.8 x the ratio of the volumes' swept bandwidths wherever the
    planner finds the step drive-bound (two drives at least are). That part is what the
    drives decide. The rest of the step (forward, backward, CPU Adam) is the guest's
    emulated CPU, which the host's other work beside the lab slows by up to 1.6 s of an
    11.5 s step on 4 drives (benchmarks/RESULTS.md), so it is not what the gain is taken
    over; the whole step is held to the planner's figure in the tests below."""
    bw = {name: _swept(sweeps[name]) for name in VOLUMES}
    assert bw["raid0x2"] / bw["single"] > 1.6 and bw["raid0x4"] / bw["single"] > 3.2, bw
    for s in STRATEGIES:
        runs = runs_by_volume(study, s)
        step = {name: runs[name]["measured"]["step_s"] for name in VOLUMES}
        assert step["single"] > step["raid0x2"] > step["raid0x4"], (s, step)
        assert plans[s][1]["drive_bound"] and plans[s][2]["drive_bound"], (s, plans[s])
        drives = {name: _drive_phases(runs[name]) for name in VOLUMES}
        for k, name in ((2, "raid0x2"), (4, "raid0x4")):
            if not plans[s][k]["drive_bound"]:
                continue
            ratio = bw[name] / bw["single"]
            assert 0 < drives[name] < step[name], (s, name, drives, step)
            gain = drives["single"] / drives[name]
            assert gain >= 0.8 * ratio, (s, name, drives, gain, ratio)


def test_the_study_predicts_each_volume_within_15_percent(study: dict[str, Any]) -> None:
    for s in STRATEGIES:
        for name, r in runs_by_volume(study, s).items():
            pred = (r.get("prediction") or {}).get("step_s")
            m = r["measured"]["step_s"]
            assert pred is not None, (s, name, r.get("prediction"))
            assert abs(pred - m) <= 0.15 * m, (s, name, pred, m)


def test_the_planner_answers_from_one_drive_within_15_percent(
    study: dict[str, Any], plans: dict[str, dict[int, dict[str, Any]]]
) -> None:
    """`estimate --drives 1,2,4` from the single drive's sweep and the RAM run, against the
    steps measured on the single drive and the two arrays."""
    for s in STRATEGIES:
        runs = runs_by_volume(study, s)
        for k, name in ((1, "single"), (2, "raid0x2"), (4, "raid0x4")):
            m = runs[name]["measured"]["step_s"]
            pred = plans[s][k]["step_s"]
            assert abs(pred - m) <= 0.15 * m, (s, k, pred, m)


def test_the_planner_answers_before_purchase_from_a_datasheet_within_15_percent(
    study: dict[str, Any], lab_runs: LabRuns
) -> None:
    """`estimate --drives 1,2,4 --drive read=2MiB/s,write=2MiB/s --baseline RUN`: the
    throttle's figure as the drives' datasheet and the single drive's NVMe run for forward +
    backward, CPU Adam and the derating (no sweep, no RAM run), against the steps measured
    on the single drive and the two arrays; every line that uses the datasheet says so."""
    for s in STRATEGIES:
        doc = lab_runs.datasheet[s]
        plans = {p["drives"]: p for p in doc["plans"]}
        assert doc["derate"]["measured"] and doc["baseline"]["kind"] == "nvme", doc
        assert 0.5 < doc["derate"]["read"] <= 1.05 and 0.5 < doc["derate"]["write"] <= 1.05, doc
        texts = [lim["text"] for lim in doc["limits"]]
        assert any(t.startswith("one drive, read (datasheet): 2.0") for t in texts), texts
        assert any(t.startswith("optimizer step without swapping") for t in texts), texts
        runs = runs_by_volume(study, s)
        for k, name in ((1, "single"), (2, "raid0x2"), (4, "raid0x4")):
            m = runs[name]["measured"]["step_s"]
            pred = plans[k]["step_s"]
            assert abs(pred - m) <= 0.15 * m, (s, k, pred, m)
            assert "datasheet" in plans[k]["terms"][0]["what"], plans[k]["terms"][0]


def test_the_run_alone_plans_with_the_drives_health_log(lab_runs: LabRuns) -> None:
    """The NVMe run without a datasheet: its drives' measured bandwidth, and the endurance
    of the drive it ran on from that drive's health log (QEMU's controller: nothing used
    yet, so no rated writes to extrapolate); the same steps as from the datasheet it was
    derated against."""
    for s in STRATEGIES:
        doc = lab_runs.run_only[s]
        assert any("health log" in n and "too little wear" in n for n in doc["notes"]), doc
        sheet = {p["drives"]: p["step_s"] for p in lab_runs.datasheet[s]["plans"]}
        for p in doc["plans"]:
            assert p["step_s"] == pytest.approx(sheet[p["drives"]], rel=0.001)
            assert p["endurance"]["dwpd"] is not None and p["endurance"]["dwpd"] > 0


def test_the_report_sets_the_volumes_side_by_side(study: dict[str, Any], lab: Lab) -> None:
    """The report reads only records, which the share holds under the same paths on the
    host: it is made there (in the guest, matplotlib on the emulated CPU took two minutes)."""
    out = lab.share / "report"
    p = subprocess.run(
        [str(BIN / "iotune"), "--json", "report", str(study["dir"])]
        + [str(lab.share / f"sweep-{n}") for n in VOLUMES]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert "step_vs_drives.png" in doc["figures"], doc
    assert (out / "step_vs_drives.png").stat().st_size > 10_000
    md = (out / "report.md").read_text()
    for s in STRATEGIES:
        for name, members in VOLUMES.items():
            k = len(members)
            label = f"{name} (raid0, {k} drives)" if k > 1 else f"{name} (1 drive)"
            assert any(s in line and label in line for line in md.splitlines()), (s, label)
    assert doc["sweeps"] == len(VOLUMES)


def test_a_member_lost_mid_study_fails_its_run_by_name_and_the_study_goes_on(
    lost_member: LostMember,
) -> None:
    """After the study, as it breaks raid0x2 (study_lab.lose_a_member): a study of two runs
    of two steps, the first on raid0x2, loses one of that array's drives (its NVMe
    controller unplugged from the guest's PCI bus) once the run has initialised. That run
    fails naming the drive and the broken array; the study goes on and the run on the
    single drive succeeds.

    The unplug happens inside the guest while the run is stopped (SIGSTOP as soon as its
    init record is written, SIGCONT once the drive is gone), so the run's first swapping
    meets the broken array however fast its steps are."""
    lost, runs = lost_member.drive, lost_member.runs
    by = {r["volume"]["name"]: r for r in runs}
    bad, good = by["raid0x2"], by["single"]
    assert bad["status"] == "failed", bad
    assert f"drive {lost} is gone" in bad["error"] and "is broken" in bad["error"], bad
    assert any(lost in f for f in bad["faults"]), bad
    assert good["status"] == "ok" and good["steps_done"] == 2, good
