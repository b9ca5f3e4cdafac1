"""By-hand counts of the latency and depth figures (iotune/trace/latency.py): the rank of a
percentile at its edges, the rounding of the depth means, and an interval's corner cases."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from iotune.trace import latency as lt
from iotune.trace.mapreader import DEPTH_SLOTS, INFLIGHT_WORDS, LAT_SLOTS

pytestmark = pytest.mark.unit


def _snap(depths: dict[int, int], busy: tuple[int, int, int] = (0, 0, 0)) -> dict[str, Any]:
    """A snapshot with no latencies: *depths* {depth at issue: issues}, *busy* the ns in
    flight of (others, reads, writes) (bpf/iotune.h: inflight words 3, 4, 5)."""
    depth = np.zeros(DEPTH_SLOTS, dtype=np.uint64)
    for d, c in depths.items():
        depth[d] = c
    inflight = np.zeros(INFLIGHT_WORDS, dtype=np.uint64)
    inflight[3:6] = busy
    return {
        "lat": np.zeros((2, 2, LAT_SLOTS), dtype=np.uint64),
        "qlat": np.zeros((2, LAT_SLOTS), dtype=np.uint64),
        "depth": depth,
        "inflight": inflight,
    }


def _at_issue(depths: dict[int, int]) -> dict[str, Any]:
    got = lt.interval(None, _snap(depths), seconds=1.0)
    assert got is not None and got["depth"]["at_issue"] is not None
    at_issue: dict[str, Any] = got["depth"]["at_issue"]
    return at_issue


def test_the_p100_of_100001_requests_is_the_last() -> None:
    """rank ceil(100/100 x 100001) = 100001: the one request of slot 1 (a divisor a hair off
    100000 would make it ceil(100001 x 100000 / 100001) = 100000, in slot 0)."""
    assert lt.rank_slot([100_000, 1], 100.0) == 1
    assert lt.rank_slot([100_000, 1], 99.999) == 0  # rank ceil(99999.99999) = 100000


def test_a_summarys_mean_is_in_microseconds() -> None:
    """One request of 1 ms: slot [983040, 1015808) ns, read back as its middle, 999424 ns."""
    hist = [0] * LAT_SLOTS
    hist[lt.lat_slot(1_000_000)] = 1
    assert lt.slot_bounds(lt.lat_slot(1_000_000)) == (983_040, 1_015_808)
    assert lt.summary(hist) == {
        "requests": 1,
        "mean_us": 999.42,
        "p50_us": 999.42,
        "p90_us": 999.42,
        "p99_us": 999.42,
        "p99_9_us": 999.42,
        "max_us": 999.42,
    }


def test_dense_adds_counts_keyed_twice() -> None:
    """ "1" and "01" are both slot 1: 2 + 3 requests."""
    assert lt.dense({"1": 2, "01": 3}, size=3) == [0, 5, 0]


def test_an_interval_with_nothing_issued_has_no_depth_at_issue() -> None:
    snap = _snap({2: 5})
    got = lt.interval(snap, snap, seconds=1.0)
    assert got is not None
    assert got["depth"]["at_issue"] is None and got["depth"]["timed"] == 0
    assert got["read"] is None and got["write"] is None


def test_the_depth_at_issue_by_hand() -> None:
    """Depths 1, 2, 2: mean 5/3 = 1.6667, shown as 1.667."""
    assert _at_issue({1: 1, 2: 2}) == {"issues": 3, "mean": 1.667, "p50": 2, "p99": 2, "max": 2}


def test_p50_and_p51_of_the_depth_fall_in_different_slots() -> None:
    """Depths 1, 1, 2, 2: p50 is rank ceil(0.5 x 4) = 2 (depth 1); p51 would be rank
    ceil(2.04) = 3 (depth 2)."""
    assert _at_issue({1: 2, 2: 2})["p50"] == 1


def test_p99_of_the_depth_is_not_its_maximum() -> None:
    """99 issues at depth 1 and one at depth 8: p99 is rank 99 (depth 1), the max 8 (p100)."""
    got = _at_issue({1: 99, 8: 1})
    assert (got["p99"], got["max"], got["issues"]) == (1, 8, 100)
    assert got["mean"] == round(107 / 100, 3) == 1.07


def test_the_kernels_depth_to_three_decimals() -> None:
    """1 ms of time in queue over 3 s: 1/3000 = 0.000333, shown as 0.0; 1 s over 3 s:
    0.3333 shown as 0.333."""
    snap = _snap({1: 1})
    got = lt.interval(None, snap, seconds=3.0, kernel_ms=1000)
    assert got is not None and got["depth"]["kernel_mean"] == 0.333
    got = lt.interval(None, snap, seconds=3.0, kernel_ms=1)
    assert got is not None and got["depth"]["kernel_mean"] == 0.0


def test_no_seconds_no_kernel_depth() -> None:
    """seconds == 0 with time in queue given: neither mean, no division by zero."""
    got = lt.interval(None, _snap({1: 1}, busy=(0, 5, 0)), seconds=0.0, kernel_ms=5)
    assert got is not None
    assert got["depth"]["kernel_mean"] is None and got["depth"]["mean"] is None


def test_the_depth_mean_rounds_an_exact_tie_to_three_decimals() -> None:
    """187.5 ms of reads in flight over 1 s: exactly 0.1875 (3/16, held exactly by a float),
    rounded half to even: 0.188. A divisor a part in 1e9 above 1e9 would leave it just
    under the tie, 0.187; four decimals would keep 0.1875."""
    snap = _snap({1: 1}, busy=(0, 187_500_000, 0))
    got = lt.interval(None, snap, seconds=1.0)
    assert got is not None and got["depth"]["mean"] == 0.188
    assert got["depth"]["busy_ns"] == {"other": 0, "read": 187_500_000, "write": 0}
    assert lt.mean_depth(got, "read", 1.0) == 0.188
    assert lt.mean_depth(got, "write", 1.0) == 0.0
