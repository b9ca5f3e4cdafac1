"""Property-based tests of every parser of a figure a user types, and of the drives planner's
invariants: whatever the input, a parser returns a positive figure or refuses it in one
line (never an internal error), every unit round-trips, a RAID0 of K+1 drives is never
slower than one of K, the bound a sentence names is the table's, and endurance falls as
writes rise. Pure logic; hypothesis draws the cases."""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from iotune.errors import UsageError
from iotune.model.dsconfig import ds_config
from iotune.model.estimate import estimate
from iotune.model.presets import get_preset
from iotune.plan.datasheet import _KEYS as _DRIVE_KEYS
from iotune.plan.datasheet import (
    LINK_WIDTHS,
    DriveSpec,
    link_bandwidth,
    load_profiles,
    parse_drive,
    parse_link,
)
from iotune.plan.drives import (
    GROWS,
    DriveInputs,
    Limit,
    Raid,
    _beyond,
    parse_target,
    plan_drives,
    smallest_for,
)
from iotune.plan.measured import AdamRate, Bandwidth, Baseline
from iotune.plan.planner import drive_counts, parse_network
from iotune.plan.predict import gradient_tail
from iotune.units import GIB, binary_size, format_size, parse_quantity, parse_size

#: the loaded profile's examples (tests/conftest.py: fewer under mutation testing) scaled up
#: for the cheap parsers, down for the planner
_N = settings().max_examples
PROPS = settings(
    max_examples=min(150, 2 * _N), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
FEW = settings(
    max_examples=max(4, min(40, _N // 2)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

SI = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
#: text that looks like a figure a user might type, and plain noise
figure_like = st.from_regex(
    r"\A[ +-]?[0-9.eE]{0,6}\s?[kKmMgGtTpPiIbBEe]{0,4}(/s|ps|/sec|bit|bits|E)?\s?\Z"
)
noise = st.text(max_size=16)
anything = st.one_of(figure_like, noise)
numbers = st.decimals(
    min_value="0.001", max_value="99999", places=3, allow_nan=False, allow_infinity=False
)


def _refused_or_positive(call: Any) -> float | None:
    """Run a parser: a positive finite figure, or None where it refused in one line."""
    try:
        v = call()
    except UsageError as e:
        assert e.message and "\n" not in e.message
        return None
    assert math.isfinite(v) and v > 0
    return float(v)


# ------------------------------------------------------------------ sizes and rates


@PROPS
@given(text=anything, rate=st.booleans(), bare=st.sampled_from(["refuse", "binary", "bits"]))
def test_any_text_gives_a_positive_figure_or_one_line(text: str, rate: bool, bare: Any) -> None:
    _refused_or_positive(lambda: parse_quantity(text, what="--x", rate=rate, bare=bare))


@PROPS
@given(num=numbers, prefix=st.sampled_from(sorted(SI)), per=st.sampled_from(["/s", "ps"]))
def test_bytes_and_bits_follow_the_case_users_write(num: Any, prefix: str, per: str) -> None:
    """GB/s is bytes, Gb/s bits: the same digits, 8x apart; SI prefixes are powers of ten."""
    assume(num > 0)
    up = prefix.upper() if prefix != "k" else prefix
    by = parse_quantity(f"{num}{up}B{per}", what="--x", rate=True)
    assert by == pytest.approx(float(num) * SI[prefix])
    bits = parse_quantity(f"{num}{up}b{per}", what="--x", rate=True)
    assert bits == pytest.approx(by / 8)
    assert parse_quantity(f"{num} {up}bit/s", what="--x", rate=True) == pytest.approx(bits)


@PROPS
@given(num=numbers, prefix=st.sampled_from(sorted(IEC)))
def test_iec_prefixes_are_powers_of_two(num: Any, prefix: str) -> None:
    assume(num > 0)
    assert parse_quantity(f"{num}{prefix}B/s", what="--x", rate=True) == pytest.approx(
        float(num) * IEC[prefix]
    )
    assert parse_quantity(f"{num}{prefix}B", what="--x", rate=False) == pytest.approx(
        float(num) * IEC[prefix]
    )


@PROPS
@given(num=numbers, prefix=st.sampled_from(["m", "g", "t", "p"]))
def test_small_letters_on_both_sides_are_refused_as_ambiguous(num: Any, prefix: str) -> None:
    assume(num > 0)
    with pytest.raises(UsageError, match="ambiguous"):
        parse_quantity(f"{num}{prefix}b/s", what="--x", rate=True)


@PROPS
@given(num=numbers, prefix=st.sampled_from(["", "K", "M", "G"]))
def test_a_rate_is_not_a_size_nor_a_bare_number(num: Any, prefix: str) -> None:
    assume(num > 0)
    with pytest.raises(UsageError):
        parse_quantity(f"{num}{prefix}B", what="--x", rate=True)
    with pytest.raises(UsageError):
        parse_quantity(f"{num}{prefix}B/s", what="--x", rate=False)
    with pytest.raises(UsageError, match="no unit"):
        parse_quantity(f"{num}{prefix}", what="--x", rate=True)


@PROPS
@given(n=st.integers(min_value=1, max_value=2**44))
def test_a_block_size_round_trips_through_its_printed_forms(n: int) -> None:
    assert parse_size(format_size(n)) == n
    value, unit = binary_size(n).split(" ")
    assert parse_size(f"{value}{unit}" if unit != "B" else value) == n


@PROPS
@given(text=anything)
def test_a_block_size_is_whole_positive_bytes_or_refused(text: str) -> None:
    v = _refused_or_positive(lambda: parse_size(text, what="--block-size"))
    if v is not None:
        assert v == int(v)


@PROPS
@given(num=st.integers(min_value=1, max_value=4096), prefix=st.sampled_from(["K", "M", "G"]))
def test_a_datasheets_kb_is_refused_for_a_block_size(num: int, prefix: str) -> None:
    """512KB is 512,000 bytes on a datasheet and 524,288 in fio: a block size refuses it."""
    with pytest.raises(UsageError, match="ambiguous"):
        parse_size(f"{num}{prefix}B")
    assert parse_size(f"{num}{prefix}iB") == parse_size(f"{num}{prefix}")


@PROPS
@given(text=anything)
def test_a_network_link_is_a_rate_or_refused(text: str) -> None:
    _refused_or_positive(lambda: parse_network(text))


@PROPS
@given(num=numbers)
def test_a_network_links_bare_g_is_gigabits_and_gb_s_bytes(num: Any) -> None:
    assume(num > 0)
    assert parse_network(f"{num}G") == pytest.approx(float(num) * 1e9 / 8)
    assert parse_network(f"{num}GbE") == pytest.approx(float(num) * 1e9 / 8)
    assert parse_network(f"{num}GB/s") == pytest.approx(float(num) * 1e9)


# ------------------------------------------------------------------ links, targets, lists


@PROPS
@given(
    speed=st.sampled_from(["2.5", "5", "8", "16", "16.0", "32", "64", "3", "0"]),
    width=st.integers(min_value=0, max_value=128),
    space=st.sampled_from(["", " "]),
)
def test_a_pcie_link_is_one_pcie_defines_or_refused(speed: str, width: int, space: str) -> None:
    text = f"{speed}{space}GT/s x{width}"
    try:
        parse_link(text)
    except UsageError as e:
        assert "is not a PCIe link" in e.message
        assert float(speed) not in (2.5, 5, 8, 16, 32, 64) or width not in LINK_WIDTHS
        return
    v = link_bandwidth(text)
    assert v is not None and width in LINK_WIDTHS
    # the fastest link PCIe has: 64 GT/s x32
    assert 0 < v <= 32 * 7.877e9


@PROPS
@given(text=anything)
@example(text="0\n")  # found by hypothesis: the message echoed the newline, on two lines
def test_a_target_step_is_positive_or_refused(text: str) -> None:
    try:
        v, relative = parse_target(text)
    except UsageError as e:
        assert "\n" not in e.message
        return
    assert math.isfinite(v) and v > 0 and (not relative or v >= 1)


@PROPS
@given(text=st.one_of(st.from_regex(r"\A[0-9, -]{0,12}\Z"), noise))
def test_a_drive_list_is_sorted_positive_counts_or_refused(text: str) -> None:
    try:
        ks = drive_counts(text)
    except UsageError:
        return
    assert ks == sorted(set(ks)) and ks and all(k >= 1 for k in ks)


# ------------------------------------------------------------------ drive specs

#: every key a spec takes, and one it does not
_keys = st.sampled_from([*_DRIVE_KEYS, "speed"])
_values = st.one_of(
    figure_like,
    st.sampled_from(
        ["7.0GB/s", "5.1GB/s", "16GT/s x4", "2TB", "1200TB", "1", "true", "x", "0", "-3"]
    ),
)
PROFILES = sorted(load_profiles()[0])


@PROPS
@given(
    base=st.one_of(st.just(None), st.sampled_from(PROFILES)),
    pairs=st.lists(st.tuples(_keys, _values), max_size=6),
)
def test_any_drive_spec_gives_a_drive_or_one_line(base: str | None, pairs: list[Any]) -> None:
    text = ",".join(([base] if base else []) + [f"{k}={v}" for k, v in pairs])
    try:
        d = parse_drive(text)
    except UsageError as e:
        assert e.message and "\n" not in e.message and e.hint
        return
    assert 0 < d.read <= 100e9 and 0 < d.write <= 100e9
    assert (d.cache is None) == (d.after_cache is None)
    if d.link is not None:
        assert link_bandwidth(d.link) is not None
    if d.capacity is not None and d.cache is not None:
        assert d.cache <= d.capacity


@PROPS
@given(name=st.sampled_from(PROFILES), scale=st.sampled_from([0.25, 0.5, 2.0, 4.0]))
def test_another_capacity_of_a_profile_keeps_its_writes_per_byte(name: str, scale: float) -> None:
    base = load_profiles()[0][name]
    assert base.capacity is not None
    cap = base.capacity * scale
    try:
        d = parse_drive(f"{name},capacity={cap / 1e9:.0f}GB")
    except UsageError as e:  # a cache larger than the smaller drive
        assert "cache is larger" in e.message
        return
    assert d.capacity is not None
    if base.rated_writes is not None and d.rated_writes is not None:
        assert d.rated_writes / d.capacity == pytest.approx(
            base.rated_writes / base.capacity, rel=1e-3
        )


# ------------------------------------------------------------------ the planner

P1B = get_preset("opt_nvme_1b")
E1B = estimate(P1B, ds_config(P1B))
ADAM = AdamRate(1e-9, 2, 10**9, "threads")
BASE = Baseline(4.0, None, "opt_ram run", backward_s=3.0)
gib_s = st.floats(min_value=0.05, max_value=20.0)

inputs_st = st.builds(
    lambda r, w, link, mem, net, chunk, block, qd, cache: DriveInputs(
        Bandwidth(r * GIB, w * GIB, {}, {"read": 1, "write": 1}, "sweep"),
        spec=None
        if cache is None
        else DriveSpec(
            "t", "t", r * GIB, w * GIB, capacity=4e12, cache=cache * 1e9, after_cache=0.4e9
        ),
        link=None if link is None else Limit("PCIe link", link * GIB, "B/s", "t"),
        memory=None if mem is None else Limit("host memory", mem * GIB, "B/s", "t"),
        network=None if net is None else Limit("network link", net * GIB, "B/s", "t"),
        raid=Raid(chunk << 10, block << 10, qd, 1, "t"),
    ),
    gib_s,
    gib_s,
    st.one_of(st.none(), gib_s),
    st.one_of(st.none(), st.floats(min_value=1.0, max_value=200.0)),
    st.one_of(st.none(), st.floats(min_value=0.5, max_value=50.0)),
    st.sampled_from([64, 128, 256, 512, 1024]),
    st.sampled_from([128, 512, 1024, 4096]),
    st.integers(min_value=1, max_value=32),
    st.one_of(st.none(), st.floats(min_value=1.0, max_value=400.0)),
)


def _fifo_tail(write_s: float, backward_s: float, params: int, bucket: int) -> float:
    """The gradients' writes simulated bucket by bucket: each bucket's gradients are ready
    when backward, producing them evenly, has made them all (the last at backward's end), and
    its write starts when it is ready and the previous one is done."""
    done, made = 0.0, 0
    while made < params:
        part = min(bucket, params - made)
        made += part
        done = max(done, made / params * backward_s) + part / params * write_s
    return max(0.0, done - backward_s)


@given(
    write_s=st.floats(min_value=0.0, max_value=100.0),
    backward_s=st.floats(min_value=0.0, max_value=100.0),
    params=st.integers(min_value=1, max_value=10**10),
    buckets=st.integers(min_value=1, max_value=300),
    cut=st.floats(min_value=0.0, max_value=0.999),
)
@example(write_s=2.05, backward_s=1.18, params=1_835_776, buckets=1, cut=0.0)
@example(write_s=1.77, backward_s=0.67, params=1_235_814_400, buckets=3, cut=0.5)
def test_the_gradients_tail_is_their_writes_bucket_by_bucket(
    write_s: float, backward_s: float, params: int, buckets: int, cut: float
) -> None:
    """The closed form the planner uses (the later of two ends) is what serving the buckets
    one after the other gives; a model within one bucket writes all of it after backward,
    and the tail is never shorter than the last bucket's write."""
    bucket = max(1, -(-params // buckets) - int(cut * (params // buckets)))
    count, tail = gradient_tail(write_s, backward_s, params, bucket)
    assert count == -(-params // bucket)
    assert tail == pytest.approx(_fifo_tail(write_s, backward_s, params, bucket), abs=1e-6)
    last = params - (count - 1) * bucket
    assert tail >= last / params * write_s - 1e-9
    if count == 1:
        assert tail == pytest.approx(write_s)


@FEW
@given(inputs=inputs_st)
def test_k_plus_one_drives_are_never_slower_than_k(inputs: DriveInputs) -> None:
    plans = plan_drives(P1B, E1B, inputs, ADAM, BASE, list(range(1, 25)))
    for a, b in itertools.pairwise(plans):
        assert b.read_bw >= a.read_bw * (1 - 1e-9) and b.write_bw >= a.write_bw * (1 - 1e-9)
        assert a.prediction.step_s is not None and b.prediction.step_s is not None
        assert b.prediction.step_s <= a.prediction.step_s * (1 + 1e-9)


@FEW
@given(inputs=inputs_st)
def test_the_bound_a_sentence_names_is_the_tables(inputs: DriveInputs) -> None:
    plans = plan_drives(P1B, E1B, inputs, ADAM, BASE, list(range(1, 65)))
    text = _beyond(plans)
    m = re.match(r"from (\d+) drives on, (.+?) caps the (swaps|reads|writes) at", text)
    if m is None:
        # nothing caps either direction: each grows up to the last K planned
        assert text.startswith("more drives approach")
        for op in ("read", "write"):
            assert getattr(plans[-2], f"{op}_bw") < getattr(plans[-1], f"{op}_bw")
        return
    k, named, what = int(m.group(1)), m.group(2), m.group(3)
    row = next(p for p in plans if p.drives == k)
    for b in named.split(" and "):
        assert b in (row.read_bound, row.write_bound) and b not in GROWS, text
    ops = ("read", "write") if what == "swaps" else (what[:-1],)
    for op in ops:
        # from the count before on, that bandwidth is the same at every K
        same = [getattr(p, f"{op}_bw") for p in plans if p.drives >= k - 1]
        assert len({round(x) for x in same}) == 1, text
    if k > 2:  # and up to it, one of them still grew
        assert any(getattr(plans[k - 3], f"{op}_bw") < getattr(row, f"{op}_bw") for op in ops)
    assert ("more drives do not help" in text) == (what == "swaps")


@FEW
@given(
    gib=st.lists(st.floats(min_value=0.1, max_value=500.0), min_size=2, max_size=5, unique=True),
    cap=st.sampled_from([1e12, 2e12, 3.84e12]),
    tbw=st.sampled_from([300e12, 1200e12, 7000e12]),
)
def test_endurance_falls_as_writes_rise(gib: list[float], cap: float, tbw: float) -> None:
    spec = DriveSpec("t", "t", 5e9, 4e9, capacity=cap, tbw=tbw)
    one = Bandwidth(4 * GIB, 3 * GIB, {}, {"read": 1, "write": 1}, "sweep")
    days, dwpd = [], []
    for g in sorted(gib):
        e = replace(E1B, steady_step=replace(E1B.steady_step, write=int(g * GIB)))
        (plan,) = plan_drives(P1B, e, DriveInputs(one, spec=spec), ADAM, BASE, [2])
        en = plan.endurance
        assert en is not None and en.days is not None and en.dwpd is not None
        days.append(en.days)
        dwpd.append(en.dwpd)
    assert days == sorted(days, reverse=True) and dwpd == sorted(dwpd)


@FEW
@given(
    cap_gb=st.integers(min_value=10, max_value=4000),
    target=st.floats(min_value=5.0, max_value=200.0),
)
def test_the_answer_never_plans_a_state_onto_drives_it_does_not_fit(
    cap_gb: int, target: float
) -> None:
    spec = DriveSpec("t", "t", 5e9, 4e9, capacity=cap_gb * 1e9)
    one = Bandwidth(4 * GIB, 3 * GIB, {}, {"read": 1, "write": 1}, "sweep")
    inputs = DriveInputs(one, spec=spec)
    k, why, _ = smallest_for(P1B, E1B, inputs, ADAM, BASE, target)
    if k is not None:
        assert k * cap_gb * 1e9 >= E1B.nvme_bytes, why
        plans = plan_drives(P1B, E1B, inputs, ADAM, BASE, [k])
        assert plans[0].fits is True
