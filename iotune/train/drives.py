"""How many drives a run needs: the step of a preset on a RAID0 of K drives like the one a
sweep measured. Pure.

A RAID0 of K drives stripes every request over its members, so DeepSpeed's large sequential
swaps see K times one drive's bandwidth, as long as nothing in front of the drives is
narrower: each drive's own PCIe link (its ceiling, whatever the sweep found) and, where it
is known, the host's memory bandwidth (every swapped byte crosses RAM once). The step is
then :func:`iotune.train.predict.predict`'s at that bandwidth: the swaps shrink as 1/K, CPU
Adam and forward + backward do not, so the speed-up flattens where the drives stop being
what the step waits for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from iotune.train.estimate import Estimate
from iotune.train.predict import AdamRate, Bandwidth, Baseline, Prediction, predict
from iotune.train.presets import Preset
from iotune.units import amount

#: usable bytes/s per lane after line coding, by link speed in GT/s (PCIe 1.0 to 6.0)
_PER_LANE = {2.5: 0.25e9, 5.0: 0.5e9, 8.0: 0.985e9, 16.0: 1.969e9, 32.0: 3.938e9, 64.0: 7.877e9}
#: the most drives --target-step searches
MAX_DRIVES = 64


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
class DrivePlan:
    drives: int
    read_bw: float
    write_bw: float
    bound_by: str  # what sets the bandwidth: "drives", "PCIe link", "memory"
    prediction: Prediction
    io_s: float | None  # the step's waiting on the drives
    compute_s: float | None  # the rest: forward + backward, CPU Adam

    @property
    def drive_bound(self) -> bool | None:
        """The step waits on its drives at least as long as on everything else."""
        if self.io_s is None or self.compute_s is None:
            return None
        return self.io_s >= self.compute_s

    def to_json(self) -> dict[str, object]:
        return {
            "drives": self.drives,
            "read_bw_bytes_s": round(self.read_bw),
            "write_bw_bytes_s": round(self.write_bw),
            "bound_by": self.bound_by,
            "io_s": None if self.io_s is None else round(self.io_s, 3),
            "compute_s": None if self.compute_s is None else round(self.compute_s, 3),
            "drive_bound": self.drive_bound,
            **self.prediction.to_json(),
        }


def link_bandwidth(link: str | None) -> float | None:
    """Bytes/s of a PCIe link as sysfs and ``iotune devices`` write it ("16.0 GT/s x4"),
    None where it is not reported (emulated controllers)."""
    if not link:
        return None
    m = re.search(r"([\d.]+)\s*GT/s.*?x(\d+)", link)
    if not m:
        return None
    per_lane = _PER_LANE.get(float(m.group(1)))
    return per_lane * int(m.group(2)) if per_lane else None


def plan_drives(
    preset: Preset,
    est: Estimate,
    one: Bandwidth,
    adam: AdamRate | None,
    base: Baseline | None,
    drives: list[int],
    link: Limit | None = None,
    memory: Limit | None = None,
) -> list[DrivePlan]:
    """The step on a RAID0 of each K in *drives*, from one drive's sweep *one*."""
    out = []
    for k in drives:
        bws = {}
        bound = "drives"
        for op in ("read", "write"):
            per = getattr(one, op)
            if link is not None and link.value < per:
                per, bound = link.value, "PCIe link"
            bw = k * per
            if memory is not None and memory.value < bw:
                bw, bound = memory.value, "memory"
            bws[op] = bw
        scaled = replace(
            one,
            read=bws["read"],
            write=bws["write"],
            source=f"{k} x {one.source}",
            note=None,
        )
        pred = predict(preset, est, scaled, adam, base)
        io = compute = None
        if pred.optimizer_s is not None:
            waits = [s for w, s in pred.terms if w.startswith(("read ", "write ", "gradients "))]
            io = sum(waits)
            rest = [s for w, s in pred.terms if not w.startswith(("read ", "write ", "gradients "))]
            compute = sum(rest)
        out.append(DrivePlan(k, bws["read"], bws["write"], bound, pred, io, compute))
    return out


def smallest_for(
    preset: Preset,
    est: Estimate,
    one: Bandwidth,
    adam: AdamRate | None,
    base: Baseline | None,
    target_s: float,
    link: Limit | None = None,
    memory: Limit | None = None,
) -> tuple[int | None, str]:
    """The fewest drives whose predicted step is at most *target_s*, or why none is."""
    plans = plan_drives(preset, est, one, adam, base, list(range(1, MAX_DRIVES + 1)), link, memory)
    if plans[0].prediction.step_s is None:
        notes = plans[0].prediction.notes
        why = next((n for n in notes if "step time" in n), "; ".join(notes))
        return None, f"no answer: {why or 'the step cannot be predicted'}"
    for p in plans:
        step = p.prediction.step_s
        if step is not None and step <= target_s:
            return p.drives, (
                f"{p.drives} drive(s): {step:.2f} s predicted, within {target_s:.2f} s"
            )
    floor = plans[-1].compute_s or 0.0
    last = plans[-1].prediction.step_s or 0.0
    if floor >= target_s:
        return None, (
            f"none: without any wait on the drives the step is still {floor:.2f} s "
            f"(forward + backward and CPU Adam), above {target_s:.2f} s"
        )
    return None, (
        f"none up to {MAX_DRIVES} drives ({last:.2f} s with {MAX_DRIVES}; "
        f"bandwidth bound by {plans[-1].bound_by})"
    )
