"""The drives' latency and in-flight depth during each sweep point: the trace's eBPF programs
(iotune/trace/latency.py) attached to the target's drives for the whole sweep, their arrays
read before and after each point. Without root or an eBPF backend the points carry none, and
the sweep says why once."""

from __future__ import annotations

import logging
import os
import statistics
from typing import Any

import numpy as np

from iotune.errors import IotuneError
from iotune.probes.sysfs import SysTree
from iotune.trace import latency as lt
from iotune.trace.backend import choose_backend, open_tracer, traces_requests
from iotune.trace.targets import devno_of, kernel_dev, resolve_path

log = logging.getLogger("iotune.sweep")

#: the timed repeats' warm-up (iotune/workers/aio_point.py), timed like a repeat
WARMUP = 1


class PointLatency:
    """Attached on construction where it can be; :attr:`why_not` says why not (None: it
    is)."""

    def __init__(self, target: str, tree: SysTree | None = None) -> None:
        self.tracer: Any = None
        self.why_not: str | None = None
        tree = tree or SysTree("/")
        try:
            disks = resolve_path(tree, target).disks
            self.devs = {n: kernel_dev(*devno_of(tree, n)) for n in disks}
            choice = choose_backend("auto", tree, is_root=os.geteuid() == 0)
            if not traces_requests(choice.backend):
                self.why_not = choice.warning or "no eBPF backend"
                return
            self.tracer = open_tracer(choice.backend, list(self.devs.values()), False, 0)
        except IotuneError as exc:
            self.why_not = exc.message
        if self.tracer is None and self.why_not is None:
            self.why_not = "the target's drives could not be traced"

    def snapshot(self) -> dict[int, Any]:
        return self.tracer.latency() if self.tracer is not None else {}

    def record(self, before: dict[int, Any], rec: dict[str, Any]) -> None:
        """Add the point's ``latency`` to its record *rec* (an ok point's): for its op, each
        drive's issue-to-completion summary (µs), the time-weighted in-flight mean over the
        point's I/O (the warm-up and the timed repeats) and the depth each issue found; and
        the same summary over all the drives' requests."""
        if self.tracer is None or rec.get("status") != "ok" or not rec.get("seconds"):
            return
        after = self.tracer.latency()
        op = rec["op"]
        i = lt.OPS.index(op)
        phase_s = statistics.median(rec["seconds"]) * (len(rec["seconds"]) + WARMUP)
        drives: dict[str, Any] = {}
        merged = np.zeros(lt.LAT_SLOTS, dtype=np.int64)
        for name, dev in self.devs.items():
            got = lt.interval(before.get(dev), after.get(dev), phase_s)
            if got is None or got.get(op) is None:
                continue
            cur, old = after[dev]["lat"][i], before[dev]["lat"][i] if dev in before else 0
            merged += (cur - old).sum(axis=0).astype(np.int64)
            drives[name] = {
                **{k: v for k, v in got[op].items() if k not in lt.CLASSES},
                "in_flight": lt.mean_depth(got, op, phase_s),
                "at_issue": got["depth"]["at_issue"],
            }
        whole = lt.summary(merged)
        if whole is None:
            return
        flights = [d["in_flight"] for d in drives.values() if d["in_flight"] is not None]
        rec["latency"] = {
            **whole,
            "in_flight_per_drive": round(sum(flights) / len(flights), 3) if flights else None,
            "phase_s": round(phase_s, 3),
            "drives": drives,
        }

    def close(self) -> None:
        if self.tracer is not None:
            self.tracer.close()
            self.tracer = None
