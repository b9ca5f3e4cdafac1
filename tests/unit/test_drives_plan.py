"""The drives planner (`iotune estimate --drives`): a RAID0 of K drives like a swept one,
from pure logic and the recorded H100 sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune.train.drives import Limit, link_bandwidth, plan_drives, smallest_for
from iotune.train.dsconfig import ds_config
from iotune.train.estimate import estimate
from iotune.train.predict import AdamRate, Bandwidth, Baseline
from iotune.train.presets import get_preset
from iotune.units import GIB

DATA = Path(__file__).resolve().parent.parent / "data" / "study-h100"
ONE = Bandwidth(2 * GIB, 3 * GIB, {}, {"read": 3, "write": 3}, "sweep")
ADAM = AdamRate(1e-9, 2, 10**9, "threads")  # 1 ns a parameter
BASE = Baseline(4.0, None, "opt_ram run", backward_s=3.0)


def _plans(drives: list[int], **kw: Limit) -> list:  # type: ignore[type-arg]
    p = get_preset("opt_nvme_1b")
    return plan_drives(p, estimate(p, ds_config(p)), ONE, ADAM, BASE, drives, **kw)


def test_pcie_links_as_sysfs_writes_them() -> None:
    assert link_bandwidth("16.0 GT/s PCIe x4") == pytest.approx(4 * 1.969e9)
    assert link_bandwidth("32.0 GT/s x16") == pytest.approx(16 * 3.938e9)
    assert link_bandwidth("Unknown x0") is None and link_bandwidth(None) is None


def test_k_drives_divide_the_swaps_and_nothing_else() -> None:
    one, two, four = _plans([1, 2, 4])
    assert (two.read_bw, two.write_bw) == (2 * ONE.read, 2 * ONE.write)
    assert one.bound_by == two.bound_by == "drives"
    assert one.io_s is not None and two.io_s is not None and four.io_s is not None
    # the swaps halve with twice the drives (the gradients' write hides behind backward)
    assert two.io_s == pytest.approx(one.io_s / 2, rel=0.02)
    # forward + backward and CPU Adam do not change
    assert one.compute_s == two.compute_s == four.compute_s
    s1, s4 = one.prediction.step_s, four.prediction.step_s
    assert s1 is not None and s4 is not None and s4 < s1
    # 1B: 18.4 GiB read and 13.8 GiB written a step: drive-bound on one drive, not on many
    assert one.drive_bound and not _plans([64])[0].drive_bound


def test_a_narrow_link_or_memory_caps_the_bandwidth() -> None:
    link = Limit("PCIe link", 1 * GIB, "B/s", "sysfs")
    (capped,) = _plans([4], link=link)
    assert capped.bound_by == "PCIe link" and capped.read_bw == 4 * GIB
    mem = Limit("host memory", 5 * GIB, "B/s", "--memory-bw")
    (m,) = _plans([8], memory=mem)
    assert m.bound_by == "memory" and m.read_bw == m.write_bw == 5 * GIB


def test_target_step_answers_with_the_fewest_drives_or_why_none() -> None:
    p = get_preset("opt_nvme_1b")
    e = estimate(p, ds_config(p))
    steps = {pl.drives: pl.prediction.step_s for pl in _plans([1, 2, 3, 4])}
    assert steps[2] is not None and steps[3] is not None
    k, why = smallest_for(p, e, ONE, ADAM, BASE, (steps[2] + steps[3]) / 2)
    assert k == 3 and why.startswith("3 drive(s)")
    # below forward + backward + Adam no number of drives helps
    k, why = smallest_for(p, e, ONE, ADAM, BASE, 3.0)
    assert k is None and "without any wait on the drives the step is still" in why
    k, why = smallest_for(p, e, ONE, ADAM, None, 10.0)
    assert k is None and "--baseline" in why


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
    assert any(t.startswith("one drive, read: 2.05 GiB/s") for t in texts), texts
    assert any(t.startswith("CPU Adam") for t in texts)
    r = CliRunner().invoke(cli_mod.cli, [*args[1:], "--link", "16.0 GT/s x4"], prog_name="iotune")
    assert r.exit_code == 0 and "PCIe link 16.0 GT/s x4 per drive: 7.34 GiB/s (--link)" in r.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--drives", "two"], "--drives 'two' is not a list of drive counts"),
        (["--drives", "0,2"], "is not a list of drive counts"),
        (["--drives", "2", "--link", "fast"], "--link 'fast' is not a PCIe link"),
        (["--target-step", "-1", "--drives", "1"], "--target-step must be positive"),
    ],
)
def test_bad_plans_get_one_line_and_a_hint(extra: list[str], message: str) -> None:
    args = ["estimate", "opt_nvme_1b", "--aio-config", str(DATA / "sweep-aio"), *extra]
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune")
    assert r.exit_code != 0 and message in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr


def test_drives_need_a_sweep() -> None:
    r = CliRunner().invoke(cli_mod.cli, ["estimate", "opt_nvme_1b", "--drives", "2"])
    assert r.exit_code != 0 and "--aio-config must name a sweep-aio run" in r.stderr
