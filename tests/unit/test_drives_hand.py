"""By-hand counts of the drives planner and the units parser (see the tests below)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from iotune.errors import UsageError
from iotune.model.dsconfig import ds_config
from iotune.model.estimate import estimate
from iotune.model.presets import get_preset
from iotune.plan.datasheet import DriveSpec
from iotune.plan.drives import (
    DriveInputs,
    DrivePlan,
    Limit,
    _beyond,
    _flat_from,
    plan_drives,
    smallest_for,
)
from iotune.plan.measured import AdamRate, Bandwidth, Baseline
from iotune.plan.predict import Prediction
from iotune.units import GIB, amount, binary_size, format_size, parse_quantity, parse_size

#: one drive of 2 GiB/s read, 3 GiB/s write (as tests/unit/test_drives_plan.py)
ONE = Bandwidth(2 * GIB, 3 * GIB, {}, {"read": 3, "write": 3}, "sweep")
#: a slow drive, 0.1 GiB/s each way: even 64 of them are what the step waits for
SLOW = Bandwidth(0.1 * GIB, 0.1 * GIB, {}, {"read": 1, "write": 1}, "sweep")
ADAM = AdamRate(1e-9, 2, 10**9, "threads")  # 1 ns a parameter
BASE = Baseline(4.0, None, "opt_ram run", backward_s=3.0)
P1B = get_preset("opt_nvme_1b")
E1B = estimate(P1B, ds_config(P1B))
#: the step without drive waits: 4.00 s forward + backward (BASE) and CPU Adam at 1 ns for
#: each of the 1B preset's 1,235,814,400 parameters, 1.24 s
TAIL = (
    "more drives approach the step without drive waits, 5.24 s: forward + backward 4.00 s "
    "and CPU Adam 1.24 s"
)


def _plans(drives: list[int], one: Bandwidth = ONE, **kw: Any) -> list[DrivePlan]:
    return plan_drives(P1B, E1B, DriveInputs(one, **kw), ADAM, BASE, drives)


def _steps(one: Bandwidth, drives: list[int]) -> dict[int, float]:
    out = {}
    for p in _plans(drives, one):
        assert p.prediction.step_s is not None
        out[p.drives] = p.prediction.step_s
    return out


def _mem(gib: float) -> Limit:
    return Limit("host memory", gib * GIB, "B/s", "t")


# ------------------------------------------------------------------ the table's figures


def test_the_parameters_of_the_1b_preset_make_the_tail() -> None:
    """TAIL's figures, counted by hand: 1 ns a parameter for each of 1,235,814,400."""
    assert E1B.params == 1_235_814_400
    (p,) = _plans([1])
    assert p.compute_s == pytest.approx(4.0 + 1.2358144)


def test_without_a_baseline_the_optimizer_step_is_predicted_and_the_step_is_not() -> None:
    # no baseline: the optimizer step is predicted (CPU Adam, the swaps), the step is not
    (p,) = plan_drives(P1B, E1B, DriveInputs(ONE), ADAM, None, [1])
    assert p.prediction.step_s is None and p.compute_s == pytest.approx(1.2358144)


def test_a_state_exactly_the_size_of_the_drives_fits() -> None:
    """The 1B preset puts 19,772,760,064 bytes on NVMe: two drives of half that hold it to
    the byte, one byte less a drive does not."""
    assert E1B.nvme_bytes == 19_772_760_064
    half = DriveSpec("t", "t", 3e9, 3e9, capacity=9_886_380_032.0)
    one, two = _plans([1, 2], spec=half)
    assert (one.fits, two.fits) == (False, True)
    short = replace(half, capacity=9_886_380_031.0)
    assert [p.fits for p in _plans([2, 3], spec=short)] == [False, True]


def test_a_drives_note_is_not_carried_into_each_count() -> None:
    """The one drive's note (a sweep measured at another configuration) is about that
    drive's measurement; K drives' bandwidth is the planner's, and its prediction has
    none of it."""
    noted = replace(ONE, note="measured at a 1 MiB block, the run's is 512 KiB")
    (p,) = _plans([2], noted)
    assert p.prediction.notes == []
    (q,) = _plans([2])
    assert p.prediction.step_s == q.prediction.step_s


def test_a_network_link_is_one_link_for_all_the_drives() -> None:
    # 5 GiB/s of network against 4 x 2 GiB/s read and 4 x 3 GiB/s write
    (p,) = _plans([4], network=Limit("network link", 5 * GIB, "B/s", "t"))
    assert (p.read_bw, p.write_bw, p.bound_by) == (5 * GIB, 5 * GIB, "network link")


def test_each_directions_bound_in_the_json() -> None:
    # 9 GiB/s of memory against 4 drives: 8 GiB/s read (the drives), 12 write (memory)
    (p,) = _plans([4], memory=_mem(9))
    doc = p.to_json()
    assert (doc["read_bound"], doc["write_bound"]) == ("drives", "memory")
    assert doc["bound_by"] == "read: drives, write: memory"
    # a plan built without them names bound_by for both, and no endurance
    bare = DrivePlan(2, 1.0, 1.0, "memory", Prediction(None, None), None, None)
    doc = bare.to_json()
    assert (doc["read_bound"], doc["write_bound"], doc["endurance"]) == ("memory", "memory", None)
    assert (doc["io_s"], doc["compute_s"], doc["drive_bound"]) == (None, None, None)


# ------------------------------------------------------------------ where growth stops


def test_flat_from_on_boundaries() -> None:
    assert _flat_from([], "read") is None
    # the same bandwidth at every count: flat from the first
    flat = _plans([1, 2, 3], memory=_mem(1))
    assert [p.read_bw for p in flat] == [GIB] * 3
    assert _flat_from(flat, "read") is flat[0] and _flat_from(flat, "write") is flat[0]
    # a gain of exactly the tolerance (one part in 10^9) is no gain
    x = 3.0 * GIB
    pred = Prediction(None, None)
    two = [DrivePlan(k, x, bw, "t", pred, None, None) for k, bw in ((1, x), (2, x * (1 + 1e-9)))]
    assert _flat_from(two, "write") is two[0]
    # more than the tolerance is a gain: growth to the last
    more = [replace(two[0]), replace(two[1], write_bw=x * (1 + 2e-9))]
    assert _flat_from(more, "write") is None


def test_a_cap_from_the_first_count_is_named_from_the_second() -> None:
    """1 GiB/s of memory under one drive of 2 GiB/s read, 3 write: every count is capped;
    the first count that gains nothing over the one before is 2."""
    plans = _plans([1, 2, 3], memory=_mem(1))
    assert _beyond(plans) == (
        "from 2 drives on, memory caps the swaps at 1.00 GiB/s read, 1.00 GiB/s write: more "
        "drives do not help"
    )


def test_a_cap_reached_at_the_last_pair_of_counts() -> None:
    """4 GiB/s of memory: reads 2, 4, 4 GiB/s on 1, 2, 3 drives, writes 3, 4, 4: the third
    drive gains nothing in either direction."""
    plans = _plans([1, 2, 3], memory=_mem(4))
    assert [p.read_bw / GIB for p in plans] == [2, 4, 4]
    assert [p.write_bw / GIB for p in plans] == [3, 4, 4]
    assert _beyond(plans) == (
        "from 3 drives on, memory caps the swaps at 4.00 GiB/s read, 4.00 GiB/s write: more "
        "drives do not help"
    )


def test_a_cap_of_the_writes_alone() -> None:
    """9 GiB/s of memory over 1..5 drives: reads 2, 4, 6, 8, 9 GiB/s (still growing at the
    fifth), writes 3, 6, 9, 9, 9 (the fourth gains nothing)."""
    plans = _plans([1, 2, 3, 4, 5], memory=_mem(9))
    assert [p.read_bw / GIB for p in plans] == [2, 4, 6, 8, 9]
    assert [p.write_bw / GIB for p in plans] == [3, 6, 9, 9, 9]
    assert _beyond(plans) == (
        "from 4 drives on, memory caps the writes at 9.00 GiB/s, while the reads grow with "
        f"more drives; {TAIL}"
    )


# ------------------------------------------------------------------ --target-step


def test_one_drive_meets_a_generous_target() -> None:
    s1 = _steps(ONE, [1])[1]
    k, why, target_s = smallest_for(P1B, E1B, DriveInputs(ONE), ADAM, BASE, 1000.0)
    assert (k, target_s) == (1, 1000.0)
    assert why == f"1 drive(s): {s1:.2f} s predicted, within 1000.00 s; {TAIL}"


def test_a_target_equal_to_a_counts_step_is_met_by_it() -> None:
    s3 = _steps(ONE, [3])[3]
    k, why, _ = smallest_for(P1B, E1B, DriveInputs(ONE), ADAM, BASE, s3)
    assert k == 3
    assert why == f"3 drive(s): {s3:.2f} s predicted, within {s3:.2f} s; {TAIL}"


def test_fewer_drives_that_cannot_hold_the_state_are_said() -> None:
    """Drives of three quarters of the 18.4 GiB the 1B preset puts on NVMe: one does not
    hold it, two do; the step of one would meet the target."""
    spec = DriveSpec("t", "t", 3e9, 3e9, capacity=0.75 * E1B.nvme_bytes)
    s2 = _steps(ONE, [2])[2]
    k, why, _ = smallest_for(P1B, E1B, DriveInputs(ONE, spec=spec), ADAM, BASE, 1000.0)
    assert k == 2
    assert why == (
        f"2 drive(s): {s2:.2f} s predicted, within 1000.00 s (fewer drives do not hold the "
        f"18.4 GiB on NVMe); {TAIL}"
    )


def test_the_search_goes_up_to_64_drives_and_no_further() -> None:
    steps = _steps(SLOW, [63, 64, 65])
    assert steps[63] > steps[64] > steps[65] > 5.24
    inputs = DriveInputs(SLOW)
    k, _, _ = smallest_for(P1B, E1B, inputs, ADAM, BASE, (steps[63] + steps[64]) / 2)
    assert k == 64
    target = (steps[64] + steps[65]) / 2
    k, why, _ = smallest_for(P1B, E1B, inputs, ADAM, BASE, target)
    assert k is None
    assert why == (
        f"none up to 64 drives ({steps[64]:.2f} s with 64, above {target:.2f} s); {TAIL}"
    )


def test_a_target_of_the_floor_itself_is_out_of_reach() -> None:
    """1x the step without drive waits: every count waits on its drives a little."""
    k, why, target_s = smallest_for(P1B, E1B, DriveInputs(ONE), ADAM, BASE, 1.0, True)
    assert k is None and target_s == pytest.approx(5.2358144)
    assert why == (
        "none: without any wait on the drives the step is still 5.24 s (forward + backward "
        "and CPU Adam), above 5.24 s (1 x the 5.24 s step without drive waits)"
    )


def test_a_step_of_nothing_but_drive_waits_has_a_floor_of_zero() -> None:
    """No forward + backward and no Adam time: the floor is 0 s, so a target below every
    count's step is the drives' to miss, not the floor's."""
    zero = Baseline(0.0, 0.0, "t")
    inputs = DriveInputs(SLOW)
    (p64,) = plan_drives(P1B, E1B, inputs, ADAM, zero, [64])
    assert p64.compute_s == 0.0 and p64.prediction.step_s is not None
    k, why, _ = smallest_for(P1B, E1B, inputs, ADAM, zero, 1.0)
    assert k is None
    assert why == (
        f"none up to 64 drives ({p64.prediction.step_s:.2f} s with 64, above 1.00 s); more "
        "drives approach the step without drive waits, 0.00 s: forward + backward 0.00 s and "
        "CPU Adam 0.00 s"
    )


def test_no_answer_says_why_from_the_predictions_notes() -> None:
    inputs = DriveInputs(ONE)
    # no CPU Adam and no baseline: the one note there is
    assert smallest_for(P1B, E1B, inputs, None, None, 10.0) == (
        None,
        "no answer: CPU Adam not measured: pass --threads-config (or --baseline)",
        None,
    )
    # a note on the Adam figure before the one about the step time: the step time's
    noted = replace(ADAM, note="CPU Adam measured at 4 threads, the run has 2")
    assert smallest_for(P1B, E1B, inputs, noted, None, 10.0) == (
        None,
        "no answer: step time needs forward + backward: pass --baseline RUN (any run of this "
        "model and batch: an NVMe run, a RAM run, a GPU-only run)",
        None,
    )


# ------------------------------------------------------------------ units


def test_ethernet_with_a_small_g_is_ambiguous() -> None:
    with pytest.raises(UsageError) as e:
        parse_quantity("25gbE", what="--x", rate=True)
    assert (e.value.message, e.value.hint) == (
        "--x '25gbE' is ambiguous: bits or bytes?",
        "write GB for bytes or Gb for bits, e.g. 7.0GB/s or 2MiB/s",
    )


def test_a_size_named_by_default() -> None:
    with pytest.raises(UsageError) as e:
        parse_size("512KB")
    assert e.value.message == (
        "size '512KB' is ambiguous: KB is 10^3 bytes on a datasheet and 2^10 in fio"
    )


@pytest.mark.parametrize("text", ["1.5k", "1.5KiB", "2.5m", "0.5g"])
def test_a_fraction_with_any_prefix_is_not_whole(text: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_size(text, what="--x")
    assert e.value.message == f"--x {text!r} is not a whole number of bytes or units"


def test_zero_bytes_print_as_bytes() -> None:
    assert binary_size(0) == "0 B" and format_size(0) == "0"


def test_an_amount_is_plain_bytes_by_default() -> None:
    assert amount(2**30) == "1.00 GiB" and amount(3 * 2**20) == "3.0 MiB"


def test_a_drive_past_its_rated_writes_has_0_days_left_not_an_unknown() -> None:
    # a health log at 100% used leaves 0 bytes: 0 days at any rate of writes; a drive whose
    # health log says nothing of its rated writes stays unknown
    (worn,) = _plans([1], capacity=2e12, writes_left=0.0)
    (blank,) = _plans([1], capacity=2e12, writes_left=None)
    assert worn.endurance is not None and blank.endurance is not None
    assert worn.endurance.per_day and worn.endurance.per_day > 0
    assert worn.endurance.days == 0.0
    assert blank.endurance.days is None
    # 1e15 bytes left at the step's writes a day: days = left / per_day
    (some,) = _plans([1], capacity=2e12, writes_left=1e15)
    assert some.endurance is not None and some.endurance.per_day
    assert some.endurance.days == pytest.approx(1e15 / some.endurance.per_day)
