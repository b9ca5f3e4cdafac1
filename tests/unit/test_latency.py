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

from iotune.trace import latency as lt
from iotune.trace.bpf import DEPTH_SLOTS, INFLIGHT_WORDS, LAT_SLOTS

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
