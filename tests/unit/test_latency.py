"""The latency histograms' arithmetic (iotune/trace/latency.py, mirroring bpf/iotune.h): every
value lands in a slot that holds it, percentiles read back within 1/32 of the true value,
intervals subtract snapshots, and the in-flight mean is Little's law."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from iotune.trace import latency as lt
from iotune.trace.mapreader import DEPTH_SLOTS, INFLIGHT_WORDS, LAT_SLOTS

pytestmark = pytest.mark.unit
HEADER = Path(__file__).parents[2] / "bpf" / "iotune.h"


def test_the_constants_are_the_headers() -> None:
    text = HEADER.read_text()

    def define(name: str) -> str:
        m = re.search(rf"#define {name} (.+)", text)
        assert m, name
        return m.group(1).strip()

    assert int(define("LAT_SUB_BITS")) == lt.LAT_SUB_BITS
    assert int(define("LAT_MAX_LOG")) == lt.LAT_MAX_LOG
    assert int(define("DEPTH_SLOTS")) == DEPTH_SLOTS
    assert int(define("INFLIGHT_WORDS")) == INFLIGHT_WORDS
    assert LAT_SLOTS == lt.LAT_SLOTS == (lt.LAT_MAX_LOG - lt.LAT_SUB_BITS + 2) * lt.LAT_SUB


def test_every_value_lands_in_a_slot_that_holds_it_within_a_32nd() -> None:
    rng = random.Random(7)  # noqa: S311 - test values, not secrets
    values = [*range(0, 4096), *(rng.randrange(1, 1 << 40) for _ in range(50_000))]
    values += [(1 << k) + d for k in range(4, 40) for d in (-1, 0, 1)]
    worst = 0.0
    for v in values:
        slot = lt.lat_slot(v)
        low, high = lt.slot_bounds(slot)
        assert low <= v < high, (v, slot, low, high)
        if v:
            worst = max(worst, abs(lt.slot_value(slot) - v) / v)
    assert worst <= lt.REL_ERROR == 1 / 32
    # contiguous: each slot starts where the one before ends
    assert all(lt.slot_bounds(i)[1] == lt.slot_bounds(i + 1)[0] for i in range(LAT_SLOTS - 1))
    # longer than 2^40 ns: the last slot
    assert lt.lat_slot(1 << 45) == LAT_SLOTS - 1


@pytest.mark.parametrize("q", [50.0, 90.0, 99.0, 99.9])
def test_percentiles_are_within_the_bound_of_the_exact_ones(q: float) -> None:
    rng = np.random.default_rng(3)
    # a lognormal body (~80 µs) with a slow tail, as a drive's completions look
    ns = np.concatenate(
        [rng.lognormal(math.log(80e3), 0.3, 20_000), rng.lognormal(math.log(2e6), 0.5, 300)]
    ).astype(np.int64)
    hist = [0] * LAT_SLOTS
    for v in ns.tolist():
        hist[lt.lat_slot(v)] += 1
    exact = float(np.sort(ns)[math.ceil(q / 100 * len(ns)) - 1])
    got = lt.percentile(hist, q)
    assert got is not None
    assert abs(got - exact) <= lt.REL_ERROR * exact, (q, got, exact)


def test_a_summary_of_nothing_is_none_and_of_one_value_is_that_value() -> None:
    assert lt.summary([0] * LAT_SLOTS) is None
    hist = [0] * LAT_SLOTS
    hist[lt.lat_slot(100_000)] = 1
    s = lt.summary(hist)
    assert s is not None and s["requests"] == 1
    for key in ("p50_us", "p90_us", "p99_us", "p99_9_us", "mean_us"):
        assert abs(s[key] - 100.0) <= 100.0 * lt.REL_ERROR, (key, s)
    # the maximum as its slot's middle: within the same bound as the percentiles, where the
    # slot's upper bound overstated a value at the slot's low end by 1/16
    for ns in (100_000, 65_536, 2**30):
        one = [0] * LAT_SLOTS
        one[lt.lat_slot(ns)] = 1
        top = lt.summary(one)
        # (+ 5 ns: the figure is rounded to 0.01 µs)
        assert top is not None and abs(top["max_us"] * 1000 - ns) <= ns * lt.REL_ERROR + 5, top


def _snap(
    lat_ns: list[tuple[int, int, int]], depths: list[int], busy: int, done: int
) -> dict[str, Any]:
    lat = np.zeros((2, 2, LAT_SLOTS), dtype=np.uint64)
    for op, cls, v in lat_ns:
        lat[op, cls, lt.lat_slot(v)] += 1
    depth = np.zeros(DEPTH_SLOTS, dtype=np.uint64)
    for d in depths:
        depth[d] += 1
    return {
        "lat": lat,
        "qlat": np.zeros((2, LAT_SLOTS), dtype=np.uint64),
        "depth": depth,
        # bpf/iotune.h: in flight, -, reissued, busy ns of others, reads, writes, collided, -
        "inflight": np.array([0, 0, 0, 0, busy, 0, 0, 0], dtype=np.uint64),
    }


def test_an_interval_is_the_difference_of_two_snapshots() -> None:
    before = _snap([(0, 0, 50_000)] * 10, [1] * 10, busy=10 * 50_000, done=10)
    # ten more reads of 512 KiB at 200 µs and four other-sized writes at 1 ms, at depth 4
    after = _snap(
        [(0, 0, 50_000)] * 10 + [(0, 0, 200_000)] * 10 + [(1, 1, 1_000_000)] * 4,
        [1] * 10 + [4] * 14,
        busy=10 * 50_000 + 10 * 200_000 + 4 * 1_000_000,
        done=24,
    )
    got = lt.interval(before, after, seconds=0.002)
    assert got is not None
    assert got["read"]["requests"] == 10 and got["write"]["requests"] == 4
    assert abs(got["read"]["p50_us"] - 200) <= 200 * lt.REL_ERROR
    assert got["read"]["focus"]["requests"] == 10 and got["read"]["other"] is None
    assert got["write"]["other"]["requests"] == 4
    # Little's law: 6 ms of requests in flight over 2 ms: 3 on average
    assert got["depth"]["mean"] == 3.0 and got["depth"]["timed"] == 14
    assert got["depth"]["at_issue"] == {"issues": 14, "mean": 4.0, "p50": 4, "p99": 4, "max": 4}
    assert got["queued"] == {"read": None, "write": None}
    whole = lt.interval(None, after, seconds=1.0, hist=True)
    assert whole is not None and whole["read"]["requests"] == 20
    hist = lt.dense(whole["read"]["focus"]["histogram"])
    assert sum(hist) == 20 and hist[lt.lat_slot(50_000)] == 10
    assert lt.interval(before, None, 1.0) is None


def test_a_journal_keeps_only_what_is_not_zero() -> None:
    snap = _snap([(0, 1, 4096)], [2], busy=4096, done=1)
    got = lt.journal({7: snap})
    assert got == {
        "7": {
            "lat": {str(LAT_SLOTS + lt.lat_slot(4096)): 1},
            "qlat": {},
            "depth": {"2": 1},
            "inflight": {"4": 4096},
        }
    }


@pytest.mark.parametrize(
    ("ns", "slot", "low", "high"),
    [
        (0, 0, 0, 1),
        (-5, 0, 0, 1),
        (1, 1, 1, 2),
        (15, 15, 15, 16),
        # from 16 ns on: 16 slots an octave, each 1/16 of the octave's start wide
        (16, 16, 16, 17),
        (17, 17, 17, 18),
        (31, 31, 31, 32),
        (32, 32, 32, 34),
        (33, 32, 32, 34),
        (34, 33, 34, 36),
        (1000, 6 * 16 + 15, 992, 1024),  # octave 2^9: slots from (9 - 4 + 1) x 16
        (1024, 7 * 16, 1024, 1088),
        (2**20, 17 * 16, 2**20, 2**20 + 2**16),
        (2**39, 35 * 16 + 15 + 1, 2**39, 2**39 + 2**35),
    ],
)
def test_slots_by_hand(ns: int, slot: int, low: int, high: int) -> None:
    assert lt.lat_slot(ns) == slot
    assert lt.slot_bounds(slot) == (low, high)
    assert lt.slot_value(slot) == (low if high - low == 1 else (low + high) / 2)


def test_a_value_beyond_the_last_octave_lands_in_the_last_slot() -> None:
    assert lt.lat_slot(2**40) == lt.lat_slot(2**45) == LAT_SLOTS - 1
    assert lt.lat_slot(2**40 - 1) == LAT_SLOTS - 1  # the last octave's last slot


def test_a_summary_by_hand() -> None:
    """Three requests at 1000 ns and one at 3000 ns: slot middles 1008 and 3008 ns."""
    hist = [0] * LAT_SLOTS
    hist[lt.lat_slot(1000)] = 3
    hist[lt.lat_slot(3000)] = 1
    assert lt.slot_bounds(lt.lat_slot(3000)) == (2944, 3072)
    assert lt.summary(hist) == {
        "requests": 4,
        "mean_us": round((3 * 1008 + 3008) / 4 / 1000, 2),
        "p50_us": 1.01,
        "p90_us": 3.01,
        "p99_us": 3.01,
        "p99_9_us": 3.01,
        "max_us": 3.01,
    }


@pytest.mark.parametrize(
    ("counts", "q", "slot"),
    [
        ([4, 0, 0, 0], 100.0, 0),
        ([1, 1, 1, 1], 50.0, 1),  # rank ceil(0.5 x 4) = 2
        ([1, 1, 1, 1], 50.1, 2),  # rank ceil(2.004) = 3
        ([1, 1, 1, 1], 25.0, 0),
        ([1, 1, 1, 1], 0.001, 0),  # at least rank 1
        ([0, 0, 0, 3], 99.9, 3),
        ([999, 1], 99.9, 0),  # rank ceil(999.0) = 999
        ([999, 1], 99.95, 1),
    ],
)
def test_the_rank_of_a_percentile(counts: list[int], q: float, slot: int) -> None:
    assert lt.rank_slot(counts, q) == slot


def test_an_intervals_counters_and_the_kernels_depth() -> None:
    before = _snap([(0, 0, 50_000)], [1], busy=50_000, done=1)
    before["inflight"] = np.array([1, 0, 2, 100, 50_000, 0, 3, 0], dtype=np.uint64)
    before["qlat"][1, lt.lat_slot(4_000)] += 2
    after = _snap([(0, 0, 50_000)] * 3, [1, 2, 2], busy=150_000, done=3)
    # in flight now 2 (a level, not a counter), 5 reissued, 400 ns of others, 7 collided
    after["inflight"] = np.array([2, 0, 5, 400, 150_000, 600_000, 7, 0], dtype=np.uint64)
    after["qlat"][1, lt.lat_slot(4_000)] += 5
    got = lt.interval(before, after, seconds=0.001, hist=True, kernel_ms=3)
    assert got is not None
    d = got["depth"]
    assert d["busy_ns"] == {"other": 300, "read": 100_000, "write": 600_000}
    assert d["mean"] == round((300 + 100_000 + 600_000) / 1e6, 3)
    assert d["kernel_mean"] == 3.0  # 3 ms of time in queue over 1 ms
    assert (d["reissued"], d["collided"], d["timed"]) == (3, 4, 2)
    assert d["at_issue"] == {
        "issues": 2,
        "mean": 2.0,
        "p50": 2,
        "p99": 2,
        "max": 2,
        "histogram": {"2": 2},
    }
    w = got["queued"]["write"]
    assert w["requests"] == 3 and w["histogram"] == {str(lt.lat_slot(4_000)): 3}
    assert got["queued"]["read"] is None and got["write"] is None
    assert got["read"]["focus"]["histogram"] == {str(lt.lat_slot(50_000)): 2}
    assert lt.mean_depth(got, "write", 0.001) == 0.6
    assert lt.mean_depth(got, "read", 0.0) is None and lt.mean_depth(None, "read", 1.0) is None
    none = lt.interval(before, after, seconds=0.0)
    assert (
        none is not None and none["depth"]["mean"] is None and none["depth"]["kernel_mean"] is None
    )


def test_dense_is_sparses_inverse() -> None:
    hist = [0] * LAT_SLOTS
    hist[3] = 2
    hist[LAT_SLOTS - 1] = 7
    assert lt.sparse(hist) == {"3": 2, str(LAT_SLOTS - 1): 7}
    assert lt.dense(lt.sparse(hist)) == hist
    assert lt.dense({"1": 1}, size=3) == [0, 1, 0] and lt.dense({1: 2}, size=3) == [0, 2, 0]


def _summary_before(hist: Any) -> dict[str, Any] | None:
    """lt.summary as it was before it took only the non-zero slots: every slot of the
    histogram through the percentiles and the mean."""
    counts = [int(c) for c in hist]
    n = sum(counts)
    if not n:
        return None
    top = max(i for i, c in enumerate(counts) if c)
    mean = sum(lt.slot_value(i) * c for i, c in enumerate(counts)) / n
    out: dict[str, Any] = {"requests": n, "mean_us": round(mean / 1000, 2)}
    for q in lt.QUANTILES:
        # the rank ceil(q/100 x n), as lt.rank_slot writes it (in thousandths of a percent)
        rank, seen, slot = max(1, -(-round(q * n * 1000) // 100000)), 0, len(counts) - 1
        for i, c in enumerate(counts):
            seen += c
            if seen >= rank:
                slot = i
                break
        out[f"p{q:g}_us".replace(".", "_")] = round(lt.slot_value(slot) / 1000, 2)
    out["max_us"] = round(lt.slot_value(top) / 1000, 2)
    return out


@given(
    st.dictionaries(st.integers(0, LAT_SLOTS - 1), st.integers(0, 10**12), max_size=12),
    st.booleans(),
)
def test_the_summary_of_the_non_zero_slots_is_the_summary_of_them_all(
    slots: dict[int, int], as_array: bool
) -> None:
    """The same figures for a histogram as a list and as the tracer's numpy array, empty,
    one request, or counts up to 10**12 in a dozen slots anywhere."""
    hist: Any = lt.dense(slots, LAT_SLOTS)
    if as_array:
        hist = np.array(hist, dtype=np.uint64)
    assert lt.summary(hist) == _summary_before(hist)
