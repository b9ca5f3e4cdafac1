"""How many drives a run needs: the step of a preset on a RAID0 of K drives like one drive
that a sweep measured, that a run swapped to, or that a datasheet describes. Pure.

A RAID0 of K drives stripes every request over its members, so DeepSpeed's large sequential
swaps see K times one drive's bandwidth, as long as nothing in front of the drives is
narrower:

- each drive's own PCIe link (its ceiling, whatever the sweep found);
- the array's chunk against DeepSpeed's requests: ``queue_depth`` requests of the aio block
  in flight on each of ``intra_op_parallelism`` threads, each request split at the chunk,
  keep at most that many members busy (md RAID0 sends each chunk to one member);
- a DRAM-less or consumer drive's SLC cache: once a step's writes to each drive exceed it,
  the rest goes at the sustained rate its datasheet gives;
- the host's memory bandwidth, where it is known (every swapped byte crosses RAM once);
- the swap files against the stripe: DeepSpeed's async I/O finishes one file before it
  starts the next (each thread runs one operation to its end), and md RAID0 sends chunk i
  of a file to member i mod K, so a file takes as long as its busiest member, and a file
  of 14 chunks on 4 drives gets 14 / 16 of their rate (:func:`stripe_share`). That holds
  for one stream of files (one rank, one aio thread); where several are in flight, each
  keeps busy the members another leaves idle (:meth:`Raid.share`).

The step is then :func:`iotune.plan.predict.predict`'s at that bandwidth: the swaps shrink
as 1/K, CPU Adam and forward + backward do not, so the speed-up flattens where the drives
stop being what the step waits for. Each plan says what bounds its step, and what each drive
writes a day against its rated endurance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from iotune.model.estimate import Estimate
from iotune.model.presets import Preset
from iotune.plan.datasheet import Derate, DriveSpec
from iotune.plan.measured import AdamRate, Bandwidth, Baseline
from iotune.plan.predict import Prediction, predict
from iotune.units import amount, binary_size

#: the most drives --target-step searches
MAX_DRIVES = 64
DAY_S = 86400.0
#: what a drive's rated writes are counted in (TBW: terabytes written, 10^12 bytes)
TB = 1e12


@dataclass(frozen=True)
class Limit:
    """One thing that bounds the step, with where its figure comes from."""

    what: str
    value: float  # bytes/s for a bandwidth, seconds for a time
    unit: str  # "B/s" or "s"
    source: str

    def describe(self) -> str:
        v = amount(self.value, "/s") if self.unit == "B/s" else f"{self.value:.2f} s"
        return f"{self.what}: {v} ({self.source})"


@dataclass(frozen=True)
class Raid:
    """The array's chunk against DeepSpeed's requests: how many members one swap keeps busy."""

    chunk: int
    block: int
    queue_depth: int
    threads: int
    source: str
    #: the node's ranks, each swapping its own partition with its own requests in flight
    ranks: int = 1
    #: the files one rank reads and writes in a step, bytes, each as often as it moves
    read_files: tuple[int, ...] = ()
    write_files: tuple[int, ...] = ()

    @property
    def streams(self) -> int:
        """Files in flight at once: each rank's aio threads each work through their own
        slice of every file, one file after the other."""
        return max(1, self.threads) * max(1, self.ranks)

    def share(self, op: str, k: int) -> float:
        """The share of K members' rate that this run's swap files get: one stream's files
        each take as long as their busiest member (:func:`stripe_share`); where several
        streams are in flight, the others' requests keep busy the members one leaves idle,
        and the swaps are counted at the members' whole rate."""
        if self.streams > 1:
            return 1.0
        return stripe_share(self.read_files if op == "read" else self.write_files, self.chunk, k)

    @property
    def busy(self) -> int:
        """Members DeepSpeed's requests in flight can keep busy: each rank's queue_depth x
        threads requests of one aio block covers ceil(block / chunk) chunks, one member each."""
        per = self.queue_depth * self.threads * max(1, math.ceil(self.block / self.chunk))
        return per * max(1, self.ranks)

    def describe(self) -> str:
        ranks = f"{self.ranks} ranks x " if self.ranks > 1 else ""
        return (
            f"RAID0 chunk {binary_size(self.chunk)} against {ranks}{self.queue_depth} x "
            f"{self.threads} request(s) of {binary_size(self.block)} in flight: at most "
            f"{self.busy} members busy ({self.source})"
        )


def busiest_member(size: int, chunk: int, k: int) -> int:
    """The bytes of a file of *size* bytes that land on the busiest member of a RAID0 of K
    drives, the file starting on a chunk (XFS and ext4 on md align a large file's extents
    to the stripe unit): chunk i goes to member i mod K, the last part chunk to the member
    after the last whole one."""
    whole, rest = divmod(size, chunk)
    return chunk * (whole // k) + (chunk if whole % k else rest)


def stripe_share(files: Sequence[int], chunk: int, k: int) -> float:
    """The share of K members' summed rate that swaps of *files* (bytes each) get, one file
    after the other, each done when its busiest member is: their bytes over K times the
    busiest members' bytes. 1 for one drive or no files."""
    busiest = sum(busiest_member(f, chunk, k) for f in files)
    return sum(files) / (k * busiest) if busiest else 1.0


@dataclass(frozen=True)
class Endurance:
    """What each drive of a RAID0 of K writes, against what it is rated to write."""

    per_drive_step: float  # bytes per drive per step (RAID0 spreads them evenly)
    per_day: float | None  # bytes per drive per day at the predicted step
    dwpd: float | None  # drive writes per day, of the drive's capacity
    days: float | None  # until the rated writes (TBW) are used up

    def to_json(self) -> dict[str, Any]:
        return {
            "write_bytes_per_drive_step": round(self.per_drive_step),
            "write_bytes_per_drive_day": None if self.per_day is None else round(self.per_day),
            "dwpd": None if self.dwpd is None else round(self.dwpd, 3),
            "days_to_rated_writes": None if self.days is None else round(self.days, 1),
        }


@dataclass(frozen=True)
class DrivePlan:
    drives: int
    read_bw: float
    write_bw: float
    bound_by: str  # drives, PCIe link, RAID0 chunk, SLC cache, memory, network link
    prediction: Prediction
    io_s: float | None  # the step's waiting on the drives
    compute_s: float | None  # the rest: forward + backward, CPU Adam
    endurance: Endurance | None = None
    study_step_s: float | None = None  # the study's measured step on that many drives
    read_bound: str = ""  # what bounds each direction's bandwidth (bound_by joins them)
    write_bound: str = ""
    #: the run's state fits on K drives' capacity (None: the capacity is not known)
    fits: bool | None = None

    @property
    def drive_bound(self) -> bool | None:
        """The step waits on its drives at least as long as on everything else."""
        if self.io_s is None or self.compute_s is None:
            return None
        return self.io_s >= self.compute_s

    @property
    def step_bound(self) -> str:
        """The largest part of the step: the drives (named by what bounds their bandwidth),
        CPU Adam or forward + backward."""
        p = self.prediction
        if self.io_s is None:
            return self.bound_by
        adam, fb = p.seconds("adam"), p.seconds("compute")
        if self.io_s >= max(adam, fb):
            return self.bound_by
        return "CPU Adam" if adam >= fb else "forward + backward"

    def to_json(self) -> dict[str, object]:
        return {
            "drives": self.drives,
            "read_bw_bytes_s": round(self.read_bw),
            "write_bw_bytes_s": round(self.write_bw),
            "bound_by": self.bound_by,
            "step_bound": self.step_bound,
            "io_s": None if self.io_s is None else round(self.io_s, 3),
            "compute_s": None if self.compute_s is None else round(self.compute_s, 3),
            "drive_bound": self.drive_bound,
            "read_bound": self.read_bound or self.bound_by,
            "write_bound": self.write_bound or self.bound_by,
            "fits": self.fits,
            "endurance": self.endurance.to_json() if self.endurance else None,
            "study_step_s": self.study_step_s,
            **self.prediction.to_json(),
        }


@dataclass(frozen=True)
class DriveInputs:
    """One drive as the planner sees it, and what stands in front of K of them."""

    one: Bandwidth
    spec: DriveSpec | None = None
    link: Limit | None = None
    memory: Limit | None = None
    raid: Raid | None = None
    #: the study's measured step by drive count (its single NVMe and its RAID0 of 3)
    study_steps: tuple[tuple[int, float], ...] = ()
    #: without a datasheet: each drive's capacity and the writes its health log says are
    #: left, bytes (a datasheet gives its capacity and its rated writes for a new drive)
    capacity: float | None = None
    writes_left: float | None = None
    #: the network link in front of NVMe-oF drives: one link for all K of them
    network: Limit | None = None


#: the bounds that grow with the number of drives: each drive's own
GROWS = ("drives", "PCIe link", "SLC cache")


def _bandwidth(k: int, op: str, inputs: DriveInputs, step_writes: float) -> tuple[float, str]:
    """K drives' bandwidth for *op* and what bounds it, the tightest of the candidates."""
    per = getattr(inputs.one, op)
    # each drive's rate reaches the run's swaps at the stripe's share (1 for one drive)
    share = inputs.raid.share(op, k) if inputs.raid is not None else 1.0
    found = [(k * per * share, "drives")]
    if inputs.link is not None and inputs.link.value < per:
        per = inputs.link.value
        found.append((k * per * share, "PCIe link"))
    spec = inputs.spec
    if op == "write" and spec is not None and spec.cache is not None and step_writes:
        w = step_writes / k
        eff = w / spec.write_seconds(w, per)
        if eff < per:
            per = eff
            found.append((k * per * share, "SLC cache"))
    if inputs.raid is not None and inputs.raid.busy < k:
        # the requests in flight keep that many members busy, whatever the files' rounds
        found.append((inputs.raid.busy * per, "RAID0 chunk"))
    if inputs.memory is not None:
        found.append((inputs.memory.value, "memory"))
    if inputs.network is not None:
        found.append((inputs.network.value, "network link"))
    # the tightest; on a tie the first named (the drives before what stands in front)
    return min(found, key=lambda t: t[0])


def plan_drives(
    preset: Preset,
    est: Estimate,
    inputs: DriveInputs,
    adam: AdamRate | None,
    base: Baseline | None,
    drives: list[int],
) -> list[DrivePlan]:
    """The step on a RAID0 of each K in *drives*."""
    out = []
    study = dict(inputs.study_steps)
    writes = float(est.steady_step.write)
    capacity = inputs.capacity if inputs.spec is None else inputs.spec.capacity
    for k in drives:
        (rbw, rb), (wbw, wb) = (_bandwidth(k, op, inputs, writes) for op in ("read", "write"))
        bound = rb if rb == wb else f"read: {rb}, write: {wb}"
        scaled = replace(inputs.one, read=rbw, write=wbw, note=None)
        pred = predict(preset, est, scaled, adam, base)
        io = compute = None
        if pred.optimizer_s is not None:
            io, compute = pred.drive_s, pred.other_s
        out.append(
            DrivePlan(
                k,
                rbw,
                wbw,
                bound,
                pred,
                io,
                compute,
                _endurance(inputs, writes / k, pred.step_s),
                study.get(k),
                rb,
                wb,
                None if not capacity else k * capacity >= est.nvme_bytes,
            )
        )
    return out


def _endurance(inputs: DriveInputs, per_step: float, step_s: float | None) -> Endurance:
    per_day = per_step * DAY_S / step_s if step_s else None
    spec = inputs.spec
    capacity = inputs.capacity if spec is None else spec.capacity
    left = inputs.writes_left if spec is None else spec.rated_writes
    dwpd = days = None
    if per_day:
        if capacity:
            dwpd = per_day / capacity
        if left is not None:  # a worn-out drive (none left) has 0 days, not an unknown
            days = left / per_day
    return Endurance(per_step, per_day, dwpd, days)


def _flat_from(plans: list[DrivePlan], op: str) -> DrivePlan | None:
    """The first plan from which *op*'s bandwidth no longer grows with more drives (the
    same at every larger K planned), None where it grows to the last."""
    bws = [getattr(p, f"{op}_bw") for p in plans]
    first = None
    for i in range(len(plans) - 1, -1, -1):
        if any(b > bws[i] * (1 + 1e-9) for b in bws[i + 1 :]):
            break
        first = i
    return None if first is None or first == len(plans) - 1 else plans[first]


def _beyond(plans: list[DrivePlan]) -> str:
    """What stops more drives from helping, from the planned bandwidths themselves: a
    bandwidth that stops growing in both directions (memory, the array's chunk, a network
    link) is named with the bound the table gives it from the first count it holds back;
    one that stops in one direction alone is named, and more drives still help the other;
    else the step's floor without drive waits."""
    last = plans[-1]
    p = last.prediction
    tail = (
        f"more drives approach the step without drive waits, "
        f"{(last.compute_s or 0.0):.2f} s: forward + backward {p.seconds('compute'):.2f} s and "
        f"CPU Adam {p.seconds('adam'):.2f} s"
    )
    # the first count that gains nothing over the one before, per direction (at the last
    # count that still gains, a cap may tie with the drives, which the table names first)
    after = {id(q): plans[i + 1] for i, q in enumerate(plans[:-1])}
    held = {}
    for op in ("read", "write"):
        flat = _flat_from(plans, op)
        held[op] = None if flat is None else after[id(flat)]
    r, w = held["read"], held["write"]
    if r is not None and w is not None:
        at = max(r, w, key=lambda x: x.drives)
        caps = " and ".join(dict.fromkeys((at.read_bound, at.write_bound)))
        return (
            f"from {at.drives} drives on, {caps} caps the swaps at "
            f"{amount(at.read_bw, '/s')} read, {amount(at.write_bw, '/s')} write: more "
            "drives do not help"
        )
    one = r if r is not None else w
    if one is None:
        return tail
    op, other = ("read", "write") if r is not None else ("write", "read")
    return (
        f"from {one.drives} drives on, {getattr(one, f'{op}_bound')} caps the {op}s at "
        f"{amount(getattr(one, f'{op}_bw'), '/s')}, while the {other}s grow with more drives; "
        f"{tail}"
    )


def parse_target(text: str) -> tuple[float, bool]:
    """``--target-step``: seconds, or a multiple of the step without drive waits (``1.5x``)."""
    from iotune.errors import UsageError

    t = text.strip().lower()
    relative = t.endswith("x")
    try:
        v = float(t[:-1] if relative else t)
    except ValueError:
        raise UsageError(
            f"--target-step {text!r} is neither seconds nor a multiple",
            hint="--target-step 60 (seconds) or --target-step 1.5x (of the step without "
            "waiting on drives)",
        ) from None
    if not math.isfinite(v) or v <= 0 or (relative and v < 1):
        raise UsageError(
            f"--target-step must be positive{' and at least 1x' if relative else ''}, got {text.strip()}",
            hint="--target-step 30, or 1.5x",
        )
    return v, relative


def smallest_for(
    preset: Preset,
    est: Estimate,
    inputs: DriveInputs,
    adam: AdamRate | None,
    base: Baseline | None,
    target: float,
    relative: bool = False,
) -> tuple[int | None, str, float | None]:
    """The fewest drives whose predicted step is at most the target (seconds, or *target*
    times the step without drive waits), why, and the target in seconds."""
    plans = plan_drives(preset, est, inputs, adam, base, list(range(1, MAX_DRIVES + 1)))
    if plans[0].prediction.step_s is None:
        notes = plans[0].prediction.notes
        why = next((n for n in notes if "step time" in n), "; ".join(notes))
        return None, f"no answer: {why or 'the step cannot be predicted'}", None
    floor = plans[-1].compute_s or 0.0
    target_s = target * floor if relative else target
    what = f"{target_s:.2f} s" + (
        f" ({target:g} x the {floor:.2f} s step without drive waits)" if relative else ""
    )
    beyond = _beyond(plans)
    for p in plans:
        step = p.prediction.step_s
        if step is not None and step <= target_s and p.fits is not False:
            room = (
                f" (fewer drives do not hold the {est.nvme_bytes / 2**30:,.1f} GiB on NVMe)"
                if any(q.fits is False and q.drives < p.drives for q in plans)
                else ""
            )
            return (
                p.drives,
                f"{p.drives} drive(s): {step:.2f} s predicted, within {what}{room}; {beyond}",
                target_s,
            )
    last = plans[-1].prediction.step_s or 0.0
    if floor >= target_s:
        return (
            None,
            f"none: without any wait on the drives the step is still {floor:.2f} s "
            f"(forward + backward and CPU Adam), above {what}",
            target_s,
        )
    return (
        None,
        f"none up to {MAX_DRIVES} drives ({last:.2f} s with {MAX_DRIVES}, above {what}); {beyond}",
        target_s,
    )


def derate_text(derate: Derate) -> str:
    return f"x {derate.read:.2f} read, x {derate.write:.2f} write ({derate.source})"
