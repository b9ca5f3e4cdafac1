"""Exact figures and words of the pure model code (the datasheet parser, the drives planner):
each JSON key and rounding, each refusal's message and hint, each boundary of a check, worked
by hand from the docstrings and the profile table's own text."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from iotune.errors import UsageError
from iotune.plan.datasheet import DriveSpec, _check, load_profiles, parse_drive, parse_link

TOP = Path(__file__).resolve().parents[2]
TABLE = tomllib.loads((TOP / "configs" / "drives.toml").read_text())
HINT = "--drive 'read=7.0GB/s,write=5.1GB/s,link=16GT/s x4,capacity=2TB,tbw=1200TB'"
KEYS = "read=1GB/s,write=1GB/s"


def _refusal(text: str) -> tuple[str, str | None]:
    with pytest.raises(UsageError) as exc:
        parse_drive(text)
    return exc.value.message, exc.value.hint


def test_a_profiles_json_is_its_datasheet_in_bytes() -> None:
    row = TABLE["drive"]["wd-blue-sn580-1tb"]
    assert parse_drive("wd-blue-sn580-1tb").to_json() == {
        "label": "wd-blue-sn580-1tb",
        "name": row["name"],
        "read_bytes_s": 4.15e9,
        "write_bytes_s": 4.15e9,
        "link": "16GT/s x4",
        "capacity_bytes": 1e12,
        "tbw_bytes": 600e12,
        "dwpd": None,
        "warranty_years": None,
        "rated_writes_bytes": 600e12,
        "cache_bytes": 341e9,
        "after_cache_bytes_s": 450e6,
        "dram": False,
        "source": row["source"],
        "cache_source": row["cache_source"],
    }
    keys = parse_drive(f"{KEYS},dwpd=0.5,capacity=2TB,warranty_years=5")
    assert keys.to_json()["name"] == "the drive of --drive"
    # DWPD x capacity x the warranty's days: 0.5 x 2 TB x 365 x 5
    assert keys.rated_writes == pytest.approx(1825e12)


def test_writes_past_the_cache_need_both_of_its_figures() -> None:
    # a spec made in code with half the cache's figures: every byte at the given rate
    assert DriveSpec("d", "d", 1.0, 1.0, cache=1.0).write_seconds(4.0, 2.0) == 2.0
    assert DriveSpec("d", "d", 1.0, 1.0, after_cache=1.0).write_seconds(4.0, 2.0) == 2.0


def test_a_pcie_link_refusal_names_the_speeds_and_widths() -> None:
    hint = (
        "link=16GT/s x4 (speeds 2.5, 5, 8, 16, 32, 64 GT/s; widths x1, x2, x4, x8, x12, x16, x32)"
    )
    with pytest.raises(UsageError) as exc:
        parse_link("16GT/s x3")
    assert (exc.value.message, exc.value.hint) == (
        "--drive link='16GT/s x3' is not a PCIe link",
        hint,
    )
    with pytest.raises(UsageError) as exc:
        parse_link("9GT/s x4", "--link")
    assert exc.value.message == "--link '9GT/s x4' is not a PCIe link"


@pytest.mark.parametrize(
    ("extra", "message", "hint"),
    [
        (
            "read=fast",
            "--drive read='fast' is not a rate",
            "write it with its unit, e.g. read=7.0GB/s",
        ),
        (
            "capacity=big",
            "--drive capacity='big' is not a size",
            "write it with its unit, e.g. capacity=2TB",
        ),
        ("dwpd=abc", "--drive dwpd='abc' is not a number", "e.g. dwpd=1"),
        ("dram=maybe", "--drive dram='maybe' is not true or false", "dram=false"),
        (
            "speed=1",
            "--drive has no key 'speed'",
            "the keys: read, write, link, capacity, tbw, dwpd, warranty_years, cache, "
            f"after_cache, dram; e.g. {HINT}",
        ),
        # a figure is printed to six digits as typed
        (
            "read=123.4565GB/s",
            "--drive read: 123.457 GB/s is not a drive's rate",
            "a positive figure up to 100 GB/s, e.g. read=7.0GB/s",
        ),
        (
            "capacity=1234.565TB",
            "--drive capacity: 1234.57 TB is not a drive's figure",
            "a positive size with its unit, e.g. capacity=2TB, tbw=1200TB",
        ),
        # 10,000 PB of rated writes is the most; a figure past it is a typo
        (
            "tbw=10000001TB",
            "--drive tbw: 1e+07 TB is not a drive's figure",
            "a positive size with its unit, e.g. capacity=2TB, tbw=1200TB",
        ),
        ("dwpd=0,capacity=1TB", "--drive dwpd=0 is not a rating", "e.g. dwpd=1"),
        ("dwpd=100.5,capacity=1TB", "--drive dwpd=100.5 is not a rating", "e.g. dwpd=1"),
        ("warranty_years=0", "--drive warranty_years=0 is not a warranty", "e.g. 5"),
        ("warranty_years=20.5", "--drive warranty_years=20.5 is not a warranty", "e.g. 5"),
        (
            "dwpd=1",
            "--drive gives drive writes per day (dwpd) without the drive's capacity: DWPD is a "
            "fraction of it",
            "add capacity, e.g. capacity=2TB, or give tbw= instead",
        ),
        (
            "cache=10GB",
            "--drive cache= needs after_cache=: the SLC cache's size and the write rate once it "
            "is full go together",
            "e.g. cache=341GB,after_cache=450MB/s",
        ),
        (
            "after_cache=1GB/s",
            "--drive after_cache= needs cache=: the SLC cache's size and the write rate once it "
            "is full go together",
            "e.g. cache=341GB,after_cache=450MB/s",
        ),
        (
            "capacity=1TB,cache=2TB,after_cache=1GB/s",
            "--drive cache is larger than the drive",
            "e.g. cache=216GB",
        ),
        ("read", "--drive 'read' is not KEY=VALUE", HINT),
        ("tbw=", "--drive 'tbw=' is not KEY=VALUE", HINT),
        ("tbw=1TB,tbw=2TB", "--drive gives tbw= twice", "give each key once"),
        # the value is all after the first '='
        (
            "capacity=2TB=1",
            "--drive capacity='2TB=1' is not a size",
            "write it with its unit, e.g. capacity=2TB",
        ),
    ],
)
def test_each_refusal_word_for_word(extra: str, message: str, hint: str) -> None:
    # the keys a drive needs, then the one that is wrong (a bad read rate in the read's place)
    text = f"write=1GB/s,{extra}" if extra.startswith("read=") else f"{KEYS},{extra}"
    assert _refusal(text) == (message, hint)


def test_the_refusals_of_no_drive_at_all() -> None:
    assert _refusal(" , ") == ("--drive is empty", HINT)
    names = ", ".join(sorted(TABLE["drive"]))
    assert _refusal("nosuch") == (
        "--drive 'nosuch' is no drive profile",
        f"a profile ({names}) or keys: {HINT}",
    )


def test_the_checks_bounds_are_inclusive_at_the_top() -> None:
    top = parse_drive(
        "read=100GB/s,write=1B/s,capacity=1000TB,tbw=10000000TB,dwpd=100,warranty_years=20,"
        "cache=1B,after_cache=1B/s"
    )
    assert (top.read, top.write, top.capacity, top.tbw) == (100e9, 1.0, 1e15, 1e19)
    assert (top.dwpd, top.warranty_years, top.cache) == (100.0, 20.0, 1.0)
    small = parse_drive(f"{KEYS},warranty_years=0.5,capacity=1B,tbw=1B")
    assert (small.warranty_years, small.capacity, small.tbw) == (0.5, 1.0, 1.0)
    # a cache as large as the drive (all of it SLC) is a drive's
    whole = parse_drive(f"{KEYS},capacity=1TB,cache=1TB,after_cache=1GB/s")
    assert whole.cache == whole.capacity == 1e12


@pytest.mark.parametrize("key", ["read", "write", "after_cache", "capacity", "cache", "tbw"])
def test_a_zero_figure_made_in_code_is_refused(key: str) -> None:
    zero: dict[str, Any] = {key: 0.0}
    spec = replace(DriveSpec("d", "d", 1.0, 1.0, cache=1.0, after_cache=1.0), **zero)
    with pytest.raises(UsageError, match=f"^--drive {key}: 0 "):
        _check(spec)


@pytest.mark.parametrize(
    ("text", "want"),
    [("true", True), ("yes", True), ("YES", True), ("no", False), ("False", False)],
)
def test_dram_as_a_user_writes_it(text: str, want: bool) -> None:
    assert parse_drive(f"{KEYS},dram={text}").dram is want


def test_a_profile_with_keys_says_what_was_scaled() -> None:
    base = TABLE["drive"]["samsung-980-pro-2tb"]["source"]
    one = parse_drive("samsung-980-pro-2tb,capacity=1TB")
    assert one.tbw == 600e12
    assert one.source == (
        f"{base} (with --drive's keys; tbw 600 TB scaled from the profile's 1,200 TB at 2 TB "
        "by capacity)"
    )
    # a rate alone: nothing scaled
    fast = parse_drive("samsung-980-pro-2tb,read=6GB/s")
    assert (fast.read, fast.tbw, fast.source) == (6e9, 1200e12, f"{base} (with --drive's keys)")
    # the user's DWPD at another capacity rates the drive, not the profile's TBW scaled
    dw = parse_drive("samsung-980-pro-2tb,capacity=1TB,dwpd=0.3,warranty_years=5")
    assert dw.tbw is None and dw.source == f"{base} (with --drive's keys)"
    assert dw.rated_writes == pytest.approx(0.3 * 1e12 * 365 * 5)


def test_a_profile_table_of_ones_own(tmp_path: Path) -> None:
    table = tmp_path / "drives.toml"
    table.write_text(
        '[derate]\nread = 0.5\nread_source = "r"\nwrite = 0.25\nwrite_source = "w"\n'
        '[drive.mine]\nname = "Mine"\nread = "1GB/s"\nwrite = "2GB/s"\nsource = "here"\n'
    )
    mine = parse_drive("mine", table)
    assert (mine.label, mine.name, mine.read, mine.write) == ("mine", "Mine", 1e9, 2e9)
    assert mine.cache_source is None
    _, derate = load_profiles(table)
    assert (derate.read, derate.write, derate.source) == (0.5, 0.25, "read: r; write: w")
    broken = tmp_path / "broken.toml"
    broken.write_text('[drive.x]\nname = "x"\n')
    with pytest.raises(UsageError) as exc:
        load_profiles(broken)
    assert (exc.value.message, exc.value.hint) == (
        f"cannot read the drive profiles in {broken}: 'derate'",
        "reinstall iotune",
    )


def test_a_target_step_refusal_word_for_word() -> None:
    from iotune.plan.drives import parse_target

    cases = {
        "fast": (
            "--target-step 'fast' is neither seconds nor a multiple",
            "--target-step 60 (seconds) or --target-step 1.5x (of the step without waiting on "
            "drives)",
        ),
        "0": ("--target-step must be positive, got 0", "--target-step 30, or 1.5x"),
        "0.5x": (
            "--target-step must be positive and at least 1x, got 0.5x",
            "--target-step 30, or 1.5x",
        ),
    }
    for text, want in cases.items():
        with pytest.raises(UsageError) as exc:
            parse_target(text)
        assert (exc.value.message, exc.value.hint) == want
    # the step without drive waits itself, and under a second, are targets
    assert parse_target("1x") == (1.0, True) and parse_target("0.5") == (0.5, False)


def test_endurance_json_rounding_and_a_time_limit_in_words() -> None:
    from iotune.plan.drives import Endurance, Limit

    e = Endurance(1234.5678, 98765.4321, 0.12345, 456.789)
    assert e.to_json() == {
        "write_bytes_per_drive_step": 1235,
        "write_bytes_per_drive_day": 98765,
        "dwpd": 0.123,
        "days_to_rated_writes": 456.8,
    }
    assert Endurance(1.0, None, None, None).to_json()["dwpd"] is None
    assert Limit("CPU Adam", 1.234, "s", "run").describe() == "CPU Adam: 1.23 s (run)"


def test_a_users_endurance_figures_replace_the_profiles() -> None:
    p = "samsung-980-pro-2tb"
    # the user's DWPD rates the drive (at its own capacity): the profile's TBW is dropped
    dw = parse_drive(f"{p},dwpd=0.3,warranty_years=5")
    assert dw.tbw is None and dw.to_json()["tbw_bytes"] is None
    assert dw.rated_writes == pytest.approx(0.3 * 2e12 * 365 * 5)
    # a TBW given with it is the rating, at the profile's capacity or another
    for extra in ("", ",capacity=1TB"):
        both = parse_drive(f"{p},dwpd=0.3,tbw=100TB{extra}")
        assert (both.tbw, both.rated_writes) == (100e12, 100e12), extra


# ------------------------------------------------------------------ the planner's sentences

from iotune.model.dsconfig import ds_config  # noqa: E402
from iotune.model.estimate import estimate  # noqa: E402
from iotune.model.presets import get_preset  # noqa: E402
from iotune.plan.drives import DriveInputs, Limit, Raid, _beyond, plan_drives  # noqa: E402
from iotune.plan.measured import AdamRate, Bandwidth, Baseline  # noqa: E402

_GIB = 2**30
_P = get_preset("opt_nvme_1b")
_E = estimate(_P, ds_config(_P))
_ADAM = AdamRate(1e-9, 2, 10**9, "threads")
_BASE = Baseline(4.0, None, "opt_ram run", backward_s=3.0)


def _plans(read: float, write: float, ks: int, **kw: Any) -> list[Any]:
    one = Bandwidth(read * _GIB, write * _GIB, {}, {"read": 1, "write": 1}, "sweep")
    return plan_drives(_P, _E, DriveInputs(one, **kw), _ADAM, _BASE, list(range(1, ks + 1)))


def test_a_chunk_that_keeps_two_members_busy_stops_the_swaps_at_two_drives() -> None:
    # 2 requests of 512 KiB in flight over 512 KiB chunks: 2 members at once, 2 x each drive
    plans = _plans(2, 3, 6, raid=Raid(512 << 10, 512 << 10, 2, 1, "t"))
    assert _beyond(plans) == (
        "from 3 drives on, RAID0 chunk caps the swaps at 4.00 GiB/s read, 6.00 GiB/s write: "
        "more drives do not help"
    )
    assert [p.bound_by for p in plans] == ["drives", "drives"] + ["RAID0 chunk"] * 4


def test_host_memory_caps_both_directions_from_where_each_meets_it() -> None:
    # 5 GiB/s of memory: writes (3 a drive) meet it at 2 drives, reads (2 a drive) at 3 (5
    # of 6); the 4th drive is the first that adds nothing in either direction
    plans = _plans(2, 3, 6, memory=Limit("host memory", 5 * _GIB, "B/s", "t"))
    assert _beyond(plans) == (
        "from 4 drives on, memory caps the swaps at 5.00 GiB/s read, 5.00 GiB/s write: "
        "more drives do not help"
    )
    assert plans[1].bound_by == "read: drives, write: memory"
    assert plans[1].read_bound == "drives" and plans[1].write_bound == "memory"


def test_a_cap_on_one_direction_leaves_the_other_growing() -> None:
    # reads meet 5 GiB/s at 3 drives (the 4th adds nothing); writes of 0.5 a drive reach 4
    # GiB/s at 8, still growing
    plans = _plans(2, 0.5, 8, memory=Limit("host memory", 5 * _GIB, "B/s", "t"))
    text = _beyond(plans)
    assert text.startswith(
        "from 4 drives on, memory caps the reads at 5.00 GiB/s, while the writes grow with "
        "more drives; more drives approach the step without drive waits, "
    ), text
    assert "do not help" not in text


def test_nothing_in_front_of_the_drives() -> None:
    plans = _plans(2, 3, 4)
    last = plans[-1]
    p = last.prediction
    assert _beyond(plans) == (
        f"more drives approach the step without drive waits, {last.compute_s:.2f} s: "
        f"forward + backward {p.seconds('compute'):.2f} s and CPU Adam {p.seconds('adam'):.2f} s"
    )
    # the step's floor is forward + backward and CPU Adam: the baseline's 4 s and 1 ns a
    # parameter
    assert p.seconds("compute") == pytest.approx(4.0, abs=0.6)
    assert p.seconds("adam") == pytest.approx(_P.geometry.param_count() * 1e-9, rel=0.05)


def test_a_drive_plans_record() -> None:
    spec = DriveSpec("t", "t", 5e9, 4e9, capacity=1e12, tbw=600e12)
    one = Bandwidth(2 * _GIB, 3 * _GIB, {}, {"read": 1, "write": 1}, "sweep")
    (plan,) = plan_drives(_P, _E, DriveInputs(one, spec=spec), _ADAM, _BASE, [2])
    doc: dict[str, Any] = plan.to_json()
    io, rest, step = plan.io_s, plan.compute_s, plan.prediction.step_s
    assert io is not None and rest is not None and step is not None
    assert doc["drives"] == 2 and doc["read_bw_bytes_s"] == 4 * _GIB
    assert doc["write_bw_bytes_s"] == 6 * _GIB
    assert (doc["bound_by"], doc["read_bound"], doc["write_bound"]) == ("drives",) * 3
    assert doc["fits"] is (_E.nvme_bytes <= 2e12)
    assert doc["io_s"] == round(io, 3) and doc["compute_s"] == round(rest, 3)
    assert doc["drive_bound"] is (io >= rest)
    assert doc["study_step_s"] is None and doc["step_bound"] in (
        "drives",
        "CPU Adam",
        "forward + backward",
    )
    en = doc["endurance"]
    assert en["write_bytes_per_drive_step"] == round(_E.steady_step.write / 2)
    day = _E.steady_step.write / 2 * 86400 / step
    assert en["write_bytes_per_drive_day"] == round(day)
    assert en["dwpd"] == round(day / 1e12, 3) and en["days_to_rated_writes"] == round(
        600e12 / day, 1
    )
