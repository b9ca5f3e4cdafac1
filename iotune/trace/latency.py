"""Latency and queue depth from the tracer's arrays (bpf/iotune.h): the histograms' slots,
percentiles read back within the slots' error bound, and each drive's figures over an
interval. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: bpf/iotune.h
LAT_SUB_BITS = 4
LAT_SUB = 1 << LAT_SUB_BITS
LAT_MAX_LOG = 39
LAT_SLOTS = (LAT_MAX_LOG - LAT_SUB_BITS + 2) * LAT_SUB
#: the worst relative error of a value read back as its slot's middle (half a slot's width
#: over its lower bound: 1/32)
REL_ERROR = 1 / (2 * LAT_SUB)
QUANTILES = (50.0, 90.0, 99.0, 99.9)


def lat_slot(ns: int) -> int:
    """The slot of *ns* (bpf/iotune.h lat_slot)."""
    if ns < LAT_SUB:
        return max(ns, 0)
    k = ns.bit_length() - 1
    if k > LAT_MAX_LOG:
        return LAT_SLOTS - 1
    return (k - LAT_SUB_BITS + 1) * LAT_SUB + ((ns >> (k - LAT_SUB_BITS)) & (LAT_SUB - 1))


def slot_bounds(slot: int) -> tuple[int, int]:
    """[low, high) in ns of the values in *slot* (the last slot's high is its octave's)."""
    if slot < LAT_SUB:
        return slot, slot + 1
    k = slot // LAT_SUB + LAT_SUB_BITS - 1
    sub = slot % LAT_SUB
    width = 1 << (k - LAT_SUB_BITS)
    low = (LAT_SUB + sub) * width
    return low, low + width


def slot_value(slot: int) -> float:
    """The value a slot stands for: its middle."""
    low, high = slot_bounds(slot)
    return low if high - low == 1 else (low + high) / 2


def percentile(hist: Sequence[int] | Any, q: float) -> float | None:
    """The *q*-th percentile (0-100] of a histogram of slots, in ns: the middle of the slot
    that holds the request of rank ceil(q/100 x n) (None: no requests)."""
    counts = [int(c) for c in hist]
    n = sum(counts)
    if not n:
        return None
    return slot_value(rank_slot(counts, q))


def rank_slot(counts: Sequence[int], q: float) -> int:
    """The slot of a histogram (non-empty) that holds the request of rank ceil(q/100 x n)."""
    return _rank_slot(list(enumerate(counts)), sum(counts), q, len(counts) - 1)


def _rank_slot(slots: list[tuple[int, int]], n: int, q: float, past_end: int) -> int:
    """rank_slot over (slot, count) pairs in slot order that hold *n* requests in all;
    *past_end* where they hold fewer than the rank."""
    rank = max(1, -(-round(q * n * 1000) // 100000))
    seen = 0
    for slot, c in slots:
        seen += c
        if seen >= rank:
            return slot
    return past_end


def _nonzero(hist: Sequence[int] | Any) -> list[tuple[int, int]]:
    """A histogram's non-zero slots as (slot, count) in slot order; a numpy array's found
    without a Python loop over its LAT_SLOTS slots (a trace's end summarises thousands)."""
    nonzero = getattr(hist, "nonzero", None)
    if nonzero is not None:
        idx = nonzero()[0]
        return list(zip(idx.tolist(), hist[idx].tolist(), strict=True))
    return [(i, int(c)) for i, c in enumerate(hist) if int(c)]


def sparse(hist: Sequence[int] | Any) -> dict[str, int]:
    """The non-zero slots of a histogram as {slot: count} (JSON keys)."""
    return {str(i): int(c) for i, c in enumerate(hist) if int(c)}


def dense(slots: Mapping[str, int] | Mapping[int, int], size: int = LAT_SLOTS) -> list[int]:
    out = [0] * size
    for k, v in slots.items():
        out[int(k)] += int(v)
    return out


def summary(hist: Sequence[int] | Any) -> dict[str, Any] | None:
    """Count, percentiles and maximum of a latency histogram, in µs (None: no requests)."""
    slots = _nonzero(hist)
    n = sum(c for _, c in slots)
    if not n:
        return None
    top = slots[-1][0]
    mean = sum(slot_value(i) * c for i, c in slots) / n
    out: dict[str, Any] = {"requests": n, "mean_us": round(mean / 1000, 2)}
    for q in QUANTILES:
        slot = _rank_slot(slots, n, q, len(hist) - 1)
        out[f"p{q:g}_us".replace(".", "_")] = round(slot_value(slot) / 1000, 2)
    # the largest request's slot read back as its middle, as the percentiles are: within
    # REL_ERROR of the true maximum (the slot's upper bound would overstate it by up to 1/16)
    out["max_us"] = round(slot_value(top) / 1000, 2)
    return out


#: a device's arrays as MapReader.latency() reads them (numpy arrays)
Snapshot = Mapping[str, Any]
OPS = ("read", "write")
CLASSES = ("focus", "other")


def _minus(after: Any, before: Any) -> Any:
    return after if before is None else after - before


def interval(
    before: Snapshot | None,
    after: Snapshot | None,
    seconds: float,
    hist: bool = False,
    kernel_ms: int | None = None,
) -> dict[str, Any] | None:
    """A drive's latency and depth between two snapshots (*before* None: since the tracer
    was loaded): per op, the issue-to-completion summary (µs) of every request and of the
    focus size and the others apart; per op, insertion-to-issue where requests were
    inserted; the in-flight depth: its time-weighted mean over the *seconds* (the requests'
    summed time in flight over the interval: Little's law, as iostat's aqu-sz; ``busy_ns``
    per op, for a mean over a phase of one op), the depth
    each issue found (mean, p50, p99, max), the requests issued again before their
    completion was seen. With *hist*, the histograms too (sparse: slot -> requests;
    latency.slot_bounds says a slot's ns). *kernel_ms*: the drive's time_in_queue over the
    interval (diskstats), whose mean (``kernel_mean``, iostat's aqu-sz) counts each request
    from its start, before issue, to its end. None without a snapshot."""
    if after is None:
        return None
    get = (lambda k: None) if before is None else (lambda k: before[k])
    lat = _minus(after["lat"], get("lat"))
    qlat = _minus(after["qlat"], get("qlat"))
    depth = [int(c) for c in _minus(after["depth"], get("depth"))]
    # INFLIGHT_WORDS (bpf/iotune.h): [0] is a level, the others counters
    words = [int(w) for w in after["inflight"]]
    if before is not None:
        words[1:] = [a - int(b) for a, b in zip(words[1:], before["inflight"][1:], strict=True)]
    out: dict[str, Any] = {}
    for i, op in enumerate(OPS):
        both = lat[i][0] + lat[i][1]
        entry = summary(both)
        if entry is not None:
            for j, cls in enumerate(CLASSES):
                entry[cls] = summary(lat[i][j])
                if hist:
                    entry[cls] = entry[cls] and {**entry[cls], "histogram": sparse(lat[i][j])}
        out[op] = entry
        queued = summary(qlat[i])
        if queued is not None and hist:
            queued["histogram"] = sparse(qlat[i])
        out.setdefault("queued", {})[op] = queued
    issued = sum(depth)
    busy = {"other": words[3], "read": words[4], "write": words[5]}
    timed = int(lat.sum())
    out["depth"] = {
        # Little's law: the requests' summed time in flight over the interval
        "mean": round(sum(busy.values()) / (seconds * 1e9), 3) if seconds > 0 else None,
        "busy_ns": busy,
        "kernel_mean": round(kernel_ms / 1000 / seconds, 3)
        if kernel_ms is not None and seconds > 0
        else None,
        # reads and writes timed (flushes and other ops count in the mean, not here)
        "timed": timed,
        # issues whose stamp slot another request held (timed in a hash map instead)
        "collided": words[6],
        "at_issue": None
        if not issued
        else {
            "issues": issued,
            "mean": round(sum(d * c for d, c in enumerate(depth)) / issued, 3),
            "p50": rank_slot(depth, 50.0),
            "p99": rank_slot(depth, 99.0),
            "max": max(d for d, c in enumerate(depth) if c),
            **({"histogram": sparse(depth)} if hist else {}),
        },
        "reissued": words[2],
    }
    return out


def journal(lat: Mapping[int, Snapshot]) -> dict[str, Any]:
    """A sample's arrays for samples.jsonl: per device, the non-zero entries of each (a
    flat index -> count), so an interrupted trace's intervals can be read back."""
    return {
        str(dev): {name: sparse(arr.ravel()) for name, arr in arrays.items()}
        for dev, arrays in lat.items()
    }


def mean_depth(lat: Mapping[str, Any] | None, op: str, seconds: float) -> float | None:
    """The time-weighted mean of *op*'s requests in flight over *seconds* of an interval's
    figures (Little's law over that op's time in flight); None without them."""
    if not lat or seconds <= 0:
        return None
    return round(float(lat["depth"]["busy_ns"][op]) / (seconds * 1e9), 3)
