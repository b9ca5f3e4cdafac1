"""The AIO search space, sweep points and the two strategies (pure logic).

A strategy is a generator: it yields the next batch of points to measure and receives,
via ``send``, a mapping from point key to bandwidth (None for a failed point).
"""

from __future__ import annotations

import functools
import itertools
import statistics
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from iotune.errors import UsageError

KIB = 1024
MIB = 1024 * KIB
# wider than DeepSpeed's ds_nvme_tune (block 128K-1M? queue 4-32, threads 1-8)
DEFAULT_BLOCK_SIZES = (128 * KIB, 256 * KIB, 512 * KIB, MIB, 2 * MIB, 4 * MIB, 8 * MIB)
DEFAULT_QUEUE_DEPTHS = (4, 8, 16, 32, 64, 128)
DEFAULT_THREADS = (1, 2, 4, 8)
COORDS = ("block_size", "queue_depth", "threads", "single_submit", "overlap_events")
OPS = ("read", "write")


@dataclass(frozen=True)
class Space:
    block_size: tuple[int, ...] = DEFAULT_BLOCK_SIZES
    queue_depth: tuple[int, ...] = DEFAULT_QUEUE_DEPTHS
    threads: tuple[int, ...] = DEFAULT_THREADS
    single_submit: tuple[bool, ...] = (False, True)
    overlap_events: tuple[bool, ...] = (False, True)
    ops: tuple[str, ...] = ("read", "write")

    def size(self) -> int:
        n = 1
        for c in COORDS:
            n *= len(getattr(self, c))
        return n * len(self.ops)


def check_ops(ops: Sequence[str]) -> None:
    """A sweep measures reads and writes, nothing else."""
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise UsageError(f"--ops: {', '.join(bad)} is not read or write", hint="--ops read,write")


@dataclass(frozen=True)
class Point:
    op: str
    block_size: int
    queue_depth: int
    threads: int
    single_submit: bool
    overlap_events: bool
    repeats: int = 3
    phase: str = "sweep"  # "sweep" | "final" (the finalists' race) | "cross" (balanced)
    round: int = 0  # the race's round (1, 2, ...) of a "final" point

    def key(self) -> str:
        return (
            f"{self.op}/bs={self.block_size}/qd={self.queue_depth}/t={self.threads}/"
            f"ss={int(self.single_submit)}/oe={int(self.overlap_events)}/r={self.repeats}/{self.phase}"
            + (f"/{self.round}" if self.round else "")
        )

    def config(self) -> tuple[int, int, int, bool, bool]:
        return (
            self.block_size,
            self.queue_depth,
            self.threads,
            self.single_submit,
            self.overlap_events,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


Results = Mapping[str, float | None]
Strategy = Generator[list[Point], Results, None]


def drive(strategy: Strategy, measure: Callable[[list[Point]], Results]) -> None:
    """Run *strategy* to its end: every batch it yields is measured, the results sent back."""
    try:
        batch = next(strategy)
        while True:
            batch = strategy.send(measure(batch))
    except StopIteration:
        return


def grid(space: Space, repeats: int) -> Strategy:
    for op in space.ops:
        batch = [
            Point(op, *cfg, repeats=repeats)  # type: ignore[misc]
            for cfg in itertools.product(*(getattr(space, c) for c in COORDS))
        ]
        yield batch


def _start(space: Space) -> dict[str, Any]:
    """DeepSpeed's defaults where the space has them, else the middle value."""
    defaults: dict[str, Any] = {
        "block_size": MIB,
        "queue_depth": 8,
        "threads": 1,
        "single_submit": False,
        "overlap_events": True,
    }
    out = {}
    for c in COORDS:
        values = getattr(space, c)
        out[c] = defaults[c] if defaults[c] in values else values[len(values) // 2]
    return out


#: the adaptive search's race: its finalists, and the rounds they are measured again in
FINALISTS = 4
RACE_ROUNDS = 3
#: the share of an op's configurations the adaptive search measures at most after its
#: first pass (the race included)
ADAPTIVE_SHARE = 0.25


def race_points(finalists: int = FINALISTS, rounds: int = RACE_ROUNDS) -> int:
    """Points a race measures: every finalist in its first round, then the survivors (the
    better half, at least two) in each further round."""
    points, alive = 0, finalists
    for r in range(rounds):
        points += alive
        if r < rounds - 1:
            alive = min(alive, max(2, alive // 2))
    return points


def _median_of(seen: Mapping[Any, list[float]], cfg: Any) -> float:
    return float(statistics.median(seen[cfg]))


def adaptive(
    space: Space,
    repeats: int,
    finalists: int = FINALISTS,
    rounds: int = RACE_ROUNDS,
    passes: int = 2,
    share: float = ADAPTIVE_SHARE,
) -> Strategy:
    """Coordinate search per op, then a race among the best few.

    One coordinate at a time is swept with the others held at the best so far; passes
    repeat until nothing changes, or until the next coordinate's points would take the
    search (race included) past *share* of the op's configurations: the first pass always
    completes. About sum(len(values)) points per pass instead of their product. Then the
    *finalists* best configurations (two at least; no race for one) are measured again in
    turn, round after round (phase ``final``, ``round`` 1, 2, ...): what drifts during the
    run touches a round's finalists alike. A finalist whose point fails is out; after each
    round but the last only the better half (at least two) by the median of all their
    measurements go on. :func:`best_per_op` picks among those measured in the last round.
    """
    budget = share * space.size() / max(len(space.ops), 1) - race_points(finalists, rounds)
    for op in space.ops:
        cur = _start(space)
        seen: dict[tuple[int, int, int, bool, bool], list[float]] = {}
        value = functools.partial(_median_of, seen)

        over = False
        for n in range(passes):
            changed = False
            for c in COORDS:
                cands = [Point(op, repeats=repeats, **{**cur, c: v}) for v in getattr(space, c)]
                todo = [p for p in cands if p.config() not in seen]
                over = n > 0 and len(seen) + len(todo) > budget
                if over:
                    break
                if todo:
                    res = yield todo
                    for p in todo:
                        bw = res.get(p.key())
                        seen[p.config()] = [] if bw is None else [bw]
                scored = [p for p in cands if seen[p.config()]]
                if not scored:
                    continue
                best = max(scored, key=lambda p: value(p.config()))
                if getattr(best, c) != cur[c]:
                    cur[c] = getattr(best, c)
                    changed = True
            if over or not changed:
                break
        alive = sorted((c for c in seen if seen[c]), key=value, reverse=True)[:finalists]
        for r in range(1, rounds + 1):
            if len(alive) < 2:  # nothing left to race
                break
            batch = [Point(op, *cfg, repeats=repeats, phase="final", round=r) for cfg in alive]
            res = yield batch
            alive = []
            for p in batch:
                bw = res.get(p.key())
                if bw is not None:
                    seen[p.config()].append(bw)
                    alive.append(p.config())
            if r < rounds:
                alive = sorted(alive, key=value, reverse=True)[: max(2, len(alive) // 2)]


def measurements(r: Mapping[str, Any]) -> list[float]:
    """Every timed repeat of a successful record (its median alone if it kept none)."""
    return [float(v) for v in (r.get("bw_bytes_s_all") or [r["bw_bytes_s"]])]


def by_config(
    records: Sequence[dict[str, Any]],
) -> dict[str, dict[tuple[int, int, int, bool, bool], list[dict[str, Any]]]]:
    """Successful records per op and configuration, in the order they were measured."""
    out: dict[str, dict[tuple[int, int, int, bool, bool], list[dict[str, Any]]]] = {}
    for r in records:
        if r.get("status") == "ok":
            out.setdefault(r["op"], {}).setdefault(config_of(r), []).append(r)
    return out


def pooled(recs: Sequence[dict[str, Any]]) -> float:
    """A configuration's bandwidth: the median of every measurement of it, whatever phase
    (sweep, the finalists' race, cross) took it."""
    return float(statistics.median(v for r in recs for v in measurements(r)))


def contenders(
    cfgs: Mapping[tuple[int, int, int, bool, bool], Sequence[dict[str, Any]]],
) -> list[tuple[int, int, int, bool, bool]]:
    """Of one op's configurations (successful records), those a best is chosen from: the
    ones measured in the race's last round that has a successful point (every one of a
    grid's, and of runs from before the race, whose points have no round)."""
    last = max(int(r.get("round") or 0) for rs in cfgs.values() for r in rs)
    return [c for c, rs in cfgs.items() if any(int(r.get("round") or 0) == last for r in rs)]


def best_per_op(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per op, among its :func:`contenders` (all of a grid's configurations; the survivors
    of an adaptive search's race), the one with the best median over all its measurements,
    as its latest record with ``bw_bytes_s`` (and ``pct_of_fio``) replaced by that median
    and the number of measurements and phases behind it. A configuration is never reported
    with less than the median of what was seen of it, nor chosen on a single lucky repeat,
    nor over the race's survivors on the strength of fewer measurements."""
    out: dict[str, dict[str, Any]] = {}
    for op, cfgs in by_config(records).items():
        recs = max((cfgs[c] for c in contenders(cfgs)), key=pooled)
        best = dict(recs[-1])
        best["bw_bytes_s"] = pooled(recs)
        best["measurements"] = sum(len(measurements(r)) for r in recs)
        best["phases"] = sorted({str(r.get("phase", "sweep")) for r in recs})
        if best.get("fio_bw_bytes_s"):
            best["pct_of_fio"] = 100.0 * best["bw_bytes_s"] / best["fio_bw_bytes_s"]
        out[op] = best
    return out


def config_of(r: Mapping[str, Any]) -> tuple[int, int, int, bool, bool]:
    return (
        r["block_size"],
        r["queue_depth"],
        r["threads"],
        r["single_submit"],
        r["overlap_events"],
    )


def balanced(
    records: Sequence[dict[str, Any]],
) -> tuple[tuple[int, int, int, bool, bool], float] | None:
    """The configuration with the best geometric mean of read and write bandwidth, each
    relative to the best of that op among the candidates: the :func:`contenders` of either
    op (all of a grid's; an adaptive search's race survivors) measured for both ops. Every
    bandwidth is a configuration's median over all its measurements, so the score is at
    most 1. None where no candidate is measured for both ops."""
    cfgs = by_config(records)
    if not {"read", "write"} <= set(cfgs):
        return None
    ops = ("read", "write")
    cands = set(contenders(cfgs["read"])) | set(contenders(cfgs["write"]))
    cands &= set(cfgs["read"]) & set(cfgs["write"])
    if not cands:
        return None
    bw = {op: {c: pooled(cfgs[op][c]) for c in cands} for op in ops}
    top = {op: max(bw[op].values()) for op in ops}
    score, cfg = max(
        (((bw["read"][c] / top["read"]) * (bw["write"][c] / top["write"])) ** 0.5, c) for c in cands
    )
    return cfg, score


def aio_block(cfg: tuple[int, int, int, bool, bool], use_gds: bool = False) -> dict[str, Any]:
    """DeepSpeed's runtime "aio" section: the keys deepspeed.runtime.swap_tensor reads
    (intra_op_parallelism, not num_threads/thread_count), booleans as JSON booleans."""
    bs, qd, threads, single, overlap = cfg
    return {
        "block_size": bs,
        "queue_depth": qd,
        "intra_op_parallelism": threads,
        "single_submit": bool(single),
        "overlap_events": bool(overlap),
        "use_gds": bool(use_gds),
    }
