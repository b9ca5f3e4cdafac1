"""Pure aggregation of traced counters: exact-size counts → per-direction figures, the
seed study's focus/other split, log2 histograms, and the diskstats cross-check."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from iotune.trace import latency
from iotune.trace.diskstats import SECTOR, DiskStat

OPS = ("read", "write", "discard", "flush", "other")  # index = OP_* in bpf/iotune.h
OP_EMPTY_PREFLUSH = 5  # completions only (bpf/iotune.h)
OP_FLUSH_SEQ_DONE = 6  # completions only: a sequenced data write's accounted end

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
class DirCheck:
    """One direction of the cross-check with /sys/block/<dev>/stat, in requests and sectors.

    The kernel accounts a request when it completes (blk_account_io_completion() adds its
    sectors, blk_account_io_done() its io); the tracer counts it when it is issued. Both ends
    are traced: completions must equal the kernel's counts (the same event, read in one
    consistent snapshot), and issues must equal completions less the requests that were in
    flight when tracing started (completed, never seen issued) plus those still in flight at
    the end (issued, not yet counted), less empty pre-flush writes (completed and counted
    as writes, but only their flush request is ever issued)."""

    kernel: tuple[int, int]  # (ios, sectors) from diskstats
    done: tuple[int, int]  # (ios, sectors) traced at completion
    issued: tuple[int, int]  # (ios, sectors) traced at issue
    inflight_start: int = 0
    inflight_end: int = 0
    empty_preflush: int = 0
    flush_seq_done: int = 0  # data writes the flush machinery completed a second time

    @property
    def counted(self) -> bool:
        return self.done == self.kernel

    def _issues_match(self, completed: tuple[int, int]) -> bool:
        """The issues against *completed* (ios, sectors), with the requests in flight at
        either end and the empty pre-flush writes (completed, never issued as writes)."""
        ios = completed[0] - self.empty_preflush - self.inflight_start + self.inflight_end
        if self.issued[0] != ios:
            return False
        # with nothing in flight at either end, the sectors must agree as well
        return bool(self.inflight_start or self.inflight_end) or self.issued[1] == completed[1]

    @property
    def reconciled(self) -> bool:
        """The issues against the traced completions."""
        return self._issues_match(self.done)

    @property
    def issues_add_up(self) -> bool:
        """The issues against the kernel's own count instead of the traced completions: each
        request the kernel completed in the window was seen issued (or was in flight at the
        start), and nothing else was."""
        return self._issues_match(self.kernel)

    @property
    def unseen(self) -> int:
        """Completions the kernel counted beyond the traced ones (negative: traced more)."""
        return self.kernel[0] - self.done[0]


@dataclass(frozen=True)
class Check:
    read: DirCheck
    write: DirCheck
    settled: bool = True  # False: I/O never paused while a snapshot was read
    # events the kernel did not deliver to the tracer (its programs' recursion_misses)
    missed_completions: int = 0
    missed_issues: int = 0

    @property
    def exact(self) -> bool:
        return all(d.counted and d.reconciled for d in (self.read, self.write))

    @property
    def explained_by_misses(self) -> bool:
        """Not exact, but by no more requests than the events the kernel skipped."""
        if self.exact or not (self.missed_completions or self.missed_issues):
            return False
        uncounted = sum(abs(d.done[0] - d.kernel[0]) for d in (self.read, self.write))
        unreconciled = sum(
            abs(d.issued[0] - (d.done[0] - d.empty_preflush - d.inflight_start + d.inflight_end))
            for d in (self.read, self.write)
        )
        return (
            uncounted <= self.missed_completions
            and unreconciled <= self.missed_completions + self.missed_issues
        )

    @property
    def unseen_completions(self) -> int:
        """Completions the kernel counted that reached no completion program, where the issues
        add up with the kernel's count (:attr:`explained_by_unseen`); 0 otherwise."""
        return self.read.unseen + self.write.unseen if self.explained_by_unseen else 0

    @property
    def explained_by_unseen(self) -> bool:
        """Not exact only because the kernel counted completions that fired no completion event
        here, while every request it counted was seen issued, with its size. The kernel's own
        block_io_done tracepoint, fired where it counts the io, misses the same ones (6.18 on
        virtio and loop devices, about 5 in 10,000 under load; no recursion miss is counted):
        no program attached to the completion can see them, the issues prove the rest."""
        if self.exact or not self.settled:
            return False
        dirs = (self.read, self.write)
        return all(
            d.issues_add_up and d.unseen >= 0 and d.done[1] <= d.kernel[1] for d in dirs
        ) and any(d.unseen for d in dirs)

    @property
    def empty_preflush_writes(self) -> int:
        return self.write.empty_preflush

    def describe(self) -> str:
        parts = []
        for unit, i in (("ios", 0), ("sectors", 1)):
            for label, d in (("read", self.read), ("write", self.write)):
                t, k = d.done[i], d.kernel[i]
                parts.append(f"{label} {unit} {t}/{k}" + ("" if t == k else f" ({t - k:+d})"))
        notes = []
        for label, d in (("read", self.read), ("write", self.write)):
            if d.inflight_start:
                notes.append(
                    f"{d.inflight_start} {label}(s) in flight when tracing started completed "
                    "during it (counted by the kernel, issued before the trace)"
                )
            if d.inflight_end:
                notes.append(
                    f"{d.inflight_end} {label}(s) issued in the trace were still in flight at "
                    "its end (not yet counted by the kernel)"
                )
            if d.unseen > 0 and self.explained_by_unseen:
                notes.append(
                    f"{d.unseen} {label} completion(s) the kernel counted reached no completion "
                    f"event; the {label}s issued ({d.issued[0]}) add up with the kernel's count, "
                    "so each was seen and sized"
                )
            elif not d.reconciled:
                notes.append(
                    f"{label}s issued {d.issued[0]} ({d.issued[1]} sectors) do not add up to "
                    f"the completions with the requests in flight"
                )
        if self.write.empty_preflush:
            notes.append(
                f"the kernel also counts {self.write.empty_preflush} empty pre-flush write(s), "
                "issued as flush requests"
            )
        if self.write.flush_seq_done:
            notes.append(
                f"{self.write.flush_seq_done} write(s) with data went through the flush "
                "sequence and completed twice (the second time empty); each is one io"
            )
        if self.missed_completions or self.missed_issues:
            notes.append(
                f"the kernel did not deliver up to {self.missed_issues} issue and "
                f"{self.missed_completions} completion event(s) to the tracer (a BPF program "
                "that fires while another runs on the same CPU is skipped)"
            )
        if not self.settled:
            notes.append(
                "the drive never paused while the counters were read at the start or end of "
                "the trace, so they may be a few requests apart"
            )
        head = (
            "exact: "
            if self.exact
            else "consistent: "
            if self.explained_by_misses or self.explained_by_unseen
            else "approximate: "
            if not self.settled
            else "differs: "
        )
        return head + ", ".join(parts) + "".join(f"; {n}" for n in notes)


def missed_events(missed: Mapping[str, int]) -> tuple[int, int]:
    """(issue, completion) events the kernel did not deliver to the tracer in a window, from
    the per-program deltas of :meth:`ReqSizeTracer.misses`: the kernel's own count where it
    keeps one (6.7+; a requeue taken back is an issue that stays counted) or the tracer's
    count of events that fired while one of its programs ran, whichever is larger (the
    kernel also counts skips caused by other tools' programs)."""
    issues = max(
        missed.get("block:block_rq_issue", 0) + missed.get("block:block_rq_requeue", 0),
        missed.get("nested:block_rq_issue", 0),
    )
    completions = max(
        missed.get("block:block_rq_complete", 0), missed.get("nested:block_rq_complete", 0)
    )
    return issues, completions


def check(
    read: OpStats,
    write: OpStats,
    kernel: DiskStat,
    done: Mapping[int, tuple[int, int]] | None = None,
    inflight_start: tuple[int, int] = (0, 0),
    inflight_end: tuple[int, int] = (0, 0),
    settled: bool = True,
    missed: tuple[int, int] = (0, 0),
) -> Check:
    """``done``: op index (OP_* in bpf/iotune.h) → (ios, sectors) completed in the window; None
    when completions were not traced (the issues then stand for them). ``missed``: (issue,
    completion) events the kernel skipped while tracing."""
    if done is None:
        done = {
            OPS.index("read"): (read.requests, read.bytes // SECTOR),
            OPS.index("write"): (write.requests, write.bytes // SECTOR),
        }
    pre = done.get(OP_EMPTY_PREFLUSH, (0, 0))[0]
    # a sequenced data write completes twice, its data first; the kernel accounts one io for
    # it, as does the write completion counted here: its second, empty end is only noted
    seq = done.get(OP_FLUSH_SEQ_DONE, (0, 0))[0]
    r_done = done.get(OPS.index("read"), (0, 0))
    w_done = done.get(OPS.index("write"), (0, 0))
    return Check(
        read=DirCheck(
            kernel=(kernel.read_ios, kernel.read_sectors),
            done=r_done,
            issued=(read.requests, read.bytes // SECTOR),
            inflight_start=inflight_start[0],
            inflight_end=inflight_end[0],
        ),
        write=DirCheck(
            kernel=(kernel.write_ios, kernel.write_sectors),
            done=(w_done[0] + pre, w_done[1]),
            issued=(write.requests, write.bytes // SECTOR),
            inflight_start=inflight_start[1],
            inflight_end=inflight_end[1],
            empty_preflush=pre,
            flush_seq_done=seq,
        ),
        settled=settled,
        missed_issues=missed[0],
        missed_completions=missed[1],
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


def _totals(
    delta: Any,
    s: Any,
    prev: Any,
    devs: Mapping[str, int],
    names: list[str],
    i: int,
    focus: int,
    traced: bool,
) -> dict[str, Any]:
    """One op's bytes and requests over the drives *names* in an interval (the traced
    counts, or the kernel's bytes where requests are not traced)."""
    op = OPS[i]
    stats = merge(op_stats(delta, devs[n], i, focus) for n in names)
    kernel_bytes = sum(getattr(s.stats[n] - prev.stats[n], f"{op}_bytes") for n in names)
    return {
        "bytes": stats.bytes if traced else kernel_bytes,
        "requests": stats.requests if traced else None,
        "focus_requests": stats.focus_requests if traced else None,
        "other_requests": stats.other_requests if traced else None,
        "diskstats_bytes": kernel_bytes,
    }


def step_io(row: dict[str, Any]) -> dict[str, Any]:
    """A trace interval's I/O as a run's tables count it: a step's (``init:``, ``step:``)
    over the offload drives alone where other volumes were traced beside them (its
    ``primary``), a save's or a persist's over every traced drive."""
    if row.get("primary") and row["label"].split(":")[0] in ("init", "step"):
        return {**row, **row["primary"]}
    return row


def step_rows(
    samples: list[Any],
    devs: Mapping[str, int],
    disks: Iterable[str],
    focus: int,
    traced: bool,
    ready_label: str,
    stacked: Iterable[str] = (),
    primary: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """I/O between consecutive step events (and from the start, or the workload's
    *ready_label* event, to the first), from the tracer's samples: each has a label, a time
    t, the traced counts and the kernel's per-drive stats. The *stacked* devices (md, dm:
    bio-based, no requests to trace) get the bytes the kernel counted they were asked to
    read and write. Where the *primary* drives are some of the traced ones (a training's
    offload volume, beside its checkpoint volumes), each row's ``primary`` holds the same
    totals over those alone. Pure."""
    disks = list(disks)
    primary = [n for n in primary if n in disks]
    apart = bool(primary) and len(primary) < len(disks)
    ready = [s for s in samples if s.label == ready_label]
    first = ready[-1] if ready else samples[0]
    marks = [s for s in samples if ":" in s.label and s.t >= first.t]
    # every rank of a multi-rank run marks each step; the node's step ends with the
    # last rank's mark (the ranks wait for each other in the step's collectives)
    last = {s.label: i for i, s in enumerate(marks)}
    marks = [s for i, s in enumerate(marks) if last[s.label] == i]
    if not marks:
        return []
    out = []
    prev = first
    for s in marks:
        delta = sub(s.counts, prev.counts)
        row: dict[str, Any] = {
            "label": s.label,
            "t_start": round(prev.t, 3),
            "t_end": round(s.t, 3),
        }
        for i, op in enumerate(OPS[:2]):
            row[op] = _totals(delta, s, prev, devs, disks, i, focus, traced)
            if apart:
                row.setdefault("primary", {})[op] = _totals(
                    delta, s, prev, devs, primary, i, focus, traced
                )
            for n in disks:
                per = row.setdefault("drives", {}).setdefault(n, {})
                per[op] = getattr(s.stats[n] - prev.stats[n], f"{op}_bytes")
                if traced:  # the drive's requests by exact size: {bytes: count}
                    per[f"{op}_sizes"] = op_stats(delta, devs[n], i, focus).sizes
                if i == 0 and getattr(s, "lat", None):  # its latency and depth
                    per["latency"] = latency.interval(
                        prev.lat.get(devs[n]),
                        s.lat.get(devs[n]),
                        s.t - prev.t,
                        kernel_ms=(s.stats[n] - prev.stats[n]).time_in_queue_ms,
                    )
        for n in stacked:
            if n in s.stats and n in prev.stats:
                d = s.stats[n] - prev.stats[n]
                row.setdefault("arrays", {})[n] = {"read": d.read_bytes, "write": d.write_bytes}
        out.append(row)
        prev = s
    return out


def event_label(ev: Mapping[str, Any]) -> str:
    """The sample's label for a workload's event: its name, and ``:step`` where it has one.
    Pure."""
    return str(ev.get("event", "event")) + (f":{ev['step']}" if "step" in ev else "")


def owners_since(
    now: dict[tuple[int, int, int], tuple[int, int]],
    then: dict[tuple[int, int, int], tuple[int, int]],
) -> dict[tuple[int, int, int], tuple[int, int]]:
    """Each owner's bios and sectors since *then* (those with none left out). Pure."""
    out = {}
    for key, (bios, sectors) in now.items():
        b0, s0 = then.get(key, (0, 0))
        if bios - b0 or sectors - s0:
            out[key] = (bios - b0, sectors - s0)
    return out
