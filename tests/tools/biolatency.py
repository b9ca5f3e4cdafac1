"""bcc's biolatency (libbpf-tools) beside iotune's latency histograms: its ``-D`` output read
into log2 µs buckets, and iotune's log-linear slots folded into the same buckets. Used by the
root tier's agreement test and by benchmarks/latency_agreement.py."""

from __future__ import annotations

import re

from iotune.trace import latency as lt

BIOLATENCY = "/usr/sbin/biolatency"


def buckets(text: str, disk: str) -> dict[int, int]:
    """biolatency -D's histogram of *disk*: bucket k counts [2^k, 2^(k+1)) µs (k=0: 0-1)."""
    out: dict[int, int] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"\s*disk = (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.match(r"\s*(\d+) -> (\d+)\s*:\s*(\d+)", line)
        if m and current == disk:
            high, n = int(m.group(2)), int(m.group(3))
            out[(high + 1).bit_length() - 2] = n
    return out


def ours(slots: dict[int, int]) -> tuple[dict[int, int], dict[int, int]]:
    """iotune's slots in biolatency's buckets (each slot by its middle, in whole µs as
    biolatency divides), and per bucket the requests of slots that straddle one of its
    edges: where the two histograms may rightly differ."""
    got: dict[int, int] = {}
    edge: dict[int, int] = {}
    for slot, n in slots.items():
        us = int(lt.slot_value(slot) // 1000)
        b = max(0, us.bit_length() - 1)
        got[b] = got.get(b, 0) + n
        low, high = lt.slot_bounds(slot)
        lo_b, hi_b = (
            max(0, (low // 1000).bit_length() - 1),
            max(0, ((high - 1) // 1000).bit_length() - 1),
        )
        if lo_b != hi_b:
            for k in range(lo_b, hi_b + 1):
                edge[k] = edge.get(k, 0) + n
    return got, edge
