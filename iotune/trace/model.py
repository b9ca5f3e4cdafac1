"""Pure aggregation of traced counters: exact-size counts → per-direction figures, the
seed study's focus/other split, log2 histograms, and the diskstats cross-check."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from iotune.trace.diskstats import SECTOR, DiskStat

OPS = ("read", "write", "discard", "flush", "other")  # index = OP_* in bpf/iotune.h

#: (kernel dev, op index, exact bytes) → requests
Counts = Mapping[tuple[int, int, int], int]


@dataclass(frozen=True)
class OpStats:
    bytes: int
    requests: int
    focus_requests: int | None  # None: the backend cannot tell sizes apart
    other_requests: int | None
    sizes: dict[int, int] = field(default_factory=dict)


def sub(after: Counts, before: Counts) -> dict[tuple[int, int, int], int]:
    out = {}
    for k, v in after.items():
        d = v - before.get(k, 0)
        if d:
            out[k] = d
    return out


def op_stats(counts: Counts, dev: int, op: int, focus: int) -> OpStats:
    sizes = {b: n for (d, o, b), n in counts.items() if d == dev and o == op and n}
    total = sum(sizes.values())
    at_focus = sizes.get(focus, 0)
    return OpStats(
        bytes=sum(b * n for b, n in sizes.items()),
        requests=total,
        focus_requests=at_focus,
        other_requests=total - at_focus,
        sizes=dict(sorted(sizes.items())),
    )


def merge(stats: Iterable[OpStats]) -> OpStats:
    sizes: Counter[int] = Counter()
    b = r = f = o = 0
    unknown = False
    for s in stats:
        b += s.bytes
        r += s.requests
        sizes.update(s.sizes)
        if s.focus_requests is None or s.other_requests is None:
            unknown = True
        else:
            f += s.focus_requests
            o += s.other_requests
    return OpStats(
        b, r, None if unknown else f, None if unknown else o, dict(sorted(sizes.items()))
    )


def slot_range(slot: int) -> tuple[int, int]:
    """Slot k of a log2 histogram holds sizes in [2^(k-1), 2^k - 1] (bcc's bpf_log2l); slot 0
    holds 0-byte requests."""
    return (0, 0) if slot == 0 else (2 ** (slot - 1), 2**slot - 1)


@dataclass(frozen=True)
class Check:
    """Traced totals against /sys/block/<dev>/stat deltas (requests and 512-byte sectors)."""

    read_ios: tuple[int, int]  # (traced, kernel)
    read_bytes: tuple[int, int]
    write_ios: tuple[int, int]
    write_bytes: tuple[int, int]
    flushes: int = 0  # flush requests traced

    @property
    def empty_preflush_writes(self) -> int:
        """Kernel write ios that carried no data and were issued as flush requests.

        blkdev_issue_flush() submits an empty REQ_OP_WRITE | REQ_PREFLUSH bio; blk-mq
        issues only its flush request (rwbs "FF", counted as a flush here) but accounts the
        empty write as a write io at completion. Same bytes, a few more write ios, no more
        than the flushes seen: that is this, not a lost request."""
        extra = self.write_ios[1] - self.write_ios[0]
        if self.write_bytes[0] == self.write_bytes[1] and 0 < extra <= self.flushes:
            return extra
        return 0

    @property
    def exact(self) -> bool:
        return all(
            a == b for a, b in (self.read_ios, self.read_bytes, self.write_ios, self.write_bytes)
        )

    def describe(self) -> str:
        parts = []
        for label, (t, k) in (
            ("read ios", self.read_ios),
            ("write ios", self.write_ios),
            ("read sectors", (self.read_bytes[0] // SECTOR, self.read_bytes[1] // SECTOR)),
            ("write sectors", (self.write_bytes[0] // SECTOR, self.write_bytes[1] // SECTOR)),
        ):
            parts.append(f"{label} {t}/{k}" + ("" if t == k else f" ({t - k:+d})"))
        if self.exact:
            return "exact: " + ", ".join(parts)
        if self.exact_but_preflush:
            return (
                "consistent: "
                + ", ".join(parts)
                + f"; the kernel also counts {self.empty_preflush_writes} empty pre-flush "
                "write(s), issued as flush requests"
            )
        return "differs: " + ", ".join(parts)

    @property
    def exact_but_preflush(self) -> bool:
        return (
            self.read_ios[0] == self.read_ios[1]
            and self.read_bytes[0] == self.read_bytes[1]
            and self.empty_preflush_writes > 0
        )


def check(read: OpStats, write: OpStats, kernel: DiskStat, flushes: int = 0) -> Check:
    return Check(
        read_ios=(read.requests, kernel.read_ios),
        read_bytes=(read.bytes, kernel.read_bytes),
        write_ios=(write.requests, kernel.write_ios),
        write_bytes=(write.bytes, kernel.write_bytes),
        flushes=flushes,
    )


def diskstats_only(kernel: DiskStat) -> dict[str, OpStats]:
    """What the diskstats backend knows: totals per direction, no sizes."""
    return {
        "read": OpStats(kernel.read_bytes, kernel.read_ios, None, None),
        "write": OpStats(kernel.write_bytes, kernel.write_ios, None, None),
        "discard": OpStats(kernel.discard_sectors * SECTOR, kernel.discard_ios, None, None),
        "flush": OpStats(0, kernel.flush_ios, None, None),
        "other": OpStats(0, 0, None, None),
    }
