"""Runs a trace: attach, start the workload, sample, detach on every exit path, write results.

Every sample (periodic, or at a step event the workload reports) is appended to
``samples.jsonl`` as it is taken, so an interrupted trace keeps everything up to the
interruption; the summary files are written in a ``finally`` block.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from iotune import proc
from iotune.errors import IotuneError
from iotune.probes.fabrics import DOWN_HINT
from iotune.probes.sysfs import SysTree
from iotune.records import append_record, host_facts, to_jsonable
from iotune.trace import latency, model
from iotune.trace import only as filt
from iotune.trace.acks import AckSender
from iotune.trace.backend import bpf_time, open_tracer, traces_requests
from iotune.trace.diskstats import DiskStat, read_inflight, read_stat
from iotune.trace.outputs import (
    check_json,
    devinfo,
    diskstats_json,
    opjson,
    other_io,
    write_outputs,
)
from iotune.trace.pathwatch import PathWatch
from iotune.trace.request import TraceRequest
from iotune.trace.targets import devno_of, kernel_dev
from iotune.trace.wake import Wake
from iotune.trace.workload import DeferredStop, Terminated, raise_terminated, stop_child

log = logging.getLogger("iotune.trace")

EVENTS_ENV = "IOTUNE_EVENTS"  # a workload appends JSON lines {"event": ..., "step": n} here
# a workload's event saying its own I/O starts now (imports, process start-up are done):
# the per-step rows start there, the device totals still cover the whole trace
READY = "ready"
SNAPSHOT_TRIES = 100  # re-reads until counters and diskstats are one consistent snapshot


@dataclass
class Sample:
    t: float
    label: str
    counts: dict[tuple[int, int, int], int]
    stats: dict[str, DiskStat]
    done: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    inflight: dict[str, tuple[int, int]] = field(default_factory=dict)
    settled: bool = True  # False: I/O never paused long enough for a consistent read
    lat: dict[int, Any] = field(default_factory=dict)  # per dev: MapReader.latency()


class Tracer:
    def __init__(
        self,
        req: TraceRequest,
        tree: SysTree | None = None,
        on_sample: Callable[[Sample], None] | None = None,
    ) -> None:
        self.req = req
        self.tree = tree or SysTree("/")
        self.on_sample = on_sample
        names = list(dict.fromkeys([*req.targets.disks, *req.targets.stacked]))
        self.names = names
        self.devs = {n: kernel_dev(*devno_of(self.tree, n)) for n in names}
        self.samples: list[Sample] = []
        #: each process's bios (MapReader.owners) in the "start" and "end" samples' snapshots
        self.owners_at: dict[str, dict[tuple[int, int, int], tuple[int, int]]] = {}
        self.bpf: Any = None
        self.probes: str | None = None  # the tracer's kind of programs: tp_btf or tracepoint
        self.probes_fallback: str | None = None  # why classic ones where BTF ones were wanted
        self.start = 0.0
        self.exit_code: int | None = None
        self.interrupted: str | None = None
        #: the loop's sleep: set() by a thread that wrote an event (iotune/trace/wake.py)
        self.wake = Wake()
        self.events_path = req.out / "events.jsonl"
        self.missed_start: dict[str, int] = {}
        self.missed_end: dict[str, int] = {}
        self.bpf_time: dict[str, int] | None = None
        #: CPU seconds this process spent while tracing (sampling, reading the workload's
        #: events), its own threads only: the workload's are its children's
        self.tracer_cpu_s: float | None = None
        self._events: BinaryIO | None = None  # the workload's events file, read on as it grows
        self._acks: AckSender | None = None  # a workload's marked events, sampled (acks.py)
        self._events_buf = b""  # a line the workload has not finished writing
        self.watch = PathWatch(self.tree, req.targets.disks)  # the fabrics namespaces' paths
        self.lost: str | None = None  # why the watch stopped the workload

    # ------------------------------------------------------------------ sampling
    def _counts(self) -> dict[tuple[int, int, int], int]:
        return self.bpf.counts() if self.bpf is not None else {}

    def _snapshot(self, tries: int, owners: bool = False) -> tuple[Any, ...]:
        """Counters, diskstats, in-flight counts (and *owners*: each process's bios) at once.

        The kernel's counters and the tracer's maps cannot be read atomically together, so
        read the tracer's, the kernel's twice, and the tracer's again: when nothing moved in
        between, all of them describe the same set of issued and completed requests. A
        request completing (or a bio submitted) mid-read moves them and the read is repeated."""
        names = self.names
        for _ in range(tries):
            o1 = self.bpf.owners() if owners and self.bpf is not None else {}
            c1, d1 = self._counts(), self._done()
            stats = {n: read_stat(self.tree, n) for n in names}
            infl = {n: read_inflight(self.tree, n) for n in names}
            again = {n: read_stat(self.tree, n) for n in names}
            infl2 = {n: read_inflight(self.tree, n) for n in names}
            c2, d2 = self._counts(), self._done()
            o2 = self.bpf.owners() if owners and self.bpf is not None else {}
            if c1 == c2 and d1 == d2 and stats == again and infl == infl2 and o1 == o2:
                return c1, d1, stats, infl, o1, True
            if self.bpf is None and stats == again:
                return c1, d1, stats, infl, o1, True
        return c2, d2, again, infl2, o2, False

    def _done(self) -> dict[tuple[int, int], tuple[int, int]]:
        return self.bpf.done() if self.bpf is not None else {}

    def sample(self, label: str) -> Sample:
        # the first and last samples carry the cross-check, and "ready" starts the workload's
        # own window: insist on a consistent read there
        ends = label in ("start", "end", READY)
        # at the ends, each process's bios in the requests' window (the other I/O's figures)
        edge = label in ("start", "end")
        snap = self._snapshot(SNAPSHOT_TRIES if ends else 3, owners=edge)
        counts, done, stats, inflight, owners, settled = snap
        if edge:
            self.owners_at[label] = owners
        if ends and not settled:
            log.warning(
                "the drives never paused at the %s of the trace: the check is approximate", label
            )
        s = Sample(
            t=time.monotonic() - self.start,
            label=label,
            counts=counts,
            stats=stats,
            done=done,
            inflight=inflight,
            settled=settled,
            lat=self.bpf.latency() if self.bpf is not None else {},
        )
        self.samples.append(s)
        append_record(
            self.req.out / "samples.jsonl",
            {
                "t": round(s.t, 6),
                "label": label,
                "counts": [[d, o, b, n] for (d, o, b), n in sorted(s.counts.items())],
                "completed": [[d, o, n, sec] for (d, o), (n, sec) in sorted(s.done.items())],
                "diskstats": {n: to_jsonable(v) for n, v in s.stats.items()},
                "inflight": {n: list(v) for n, v in s.inflight.items()},
                **({} if settled else {"settled": False}),
                **({"latency": latency.journal(s.lat)} if label != "interval" else {}),
            },
            # the periodic samples (one a second) are synced with the next step's or the end's:
            # an fsync each would be most of what tracing costs the machine's CPU
            sync=label != "interval",
        )
        if self.on_sample:
            self.on_sample(s)
        return s

    def _new_events(self) -> list[dict[str, Any]]:
        """The workload's new events; a ``process`` event (a worker forked by iotune's
        zygote, not by the command, iotune/workers/zygote.py) joins that pid to the
        workload instead, so its I/O is the workload's."""
        if self._events is None:
            if not self.events_path.exists():
                return []
            # kept open: one read a wake (a write to it, a sample), not a stat, an open and a close
            self._events = self.events_path.open("rb")
        self._events_buf += self._events.read()
        end = self._events_buf.rfind(b"\n") + 1
        complete = self._events_buf[:end].decode(errors="replace")
        self._events_buf = self._events_buf[end:]
        out = []
        for line in complete.splitlines():
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                log.warning("ignoring a malformed event line: %r", line[:200])
                continue
            if ev.get("event") == "process":
                if self.bpf is not None:
                    self.bpf.add_workload(int(ev["pid"]))
                continue
            out.append(ev)
        return out

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        req = self.req
        lost = self.watch.not_live() if req.command else None
        if lost is not None:  # the workload would wait on it from its first request
            raise IotuneError(
                f"not started: {lost}",
                hint=f"{DOWN_HINT}; run again once it is live",
            )
        req.out.mkdir(parents=True, exist_ok=True)
        self.events_path.touch()
        self.wake.watch(self.events_path)
        stop = DeferredStop(self.wake.set)
        signal.signal(signal.SIGTERM, raise_terminated)
        child: subprocess.Popen[bytes] | None = None
        try:
            if traces_requests(req.backend):
                # bios are attributed to submitters when there is a workload to tell apart
                devs = list(self.devs.values())
                only = "workload" if req.only_pid else "cgroup" if req.only_cgroup else None
                cg = str(filt.cgroup_dir(req.only_cgroup)) if req.only_cgroup else None
                self.bpf = open_tracer(
                    req.backend, devs, bool(req.command), req.focus, req.latency, only, cg
                )
                for pid in filt.descendants(req.only_pid) if req.only_pid else []:
                    self.bpf.add_workload(pid)
                self.probes, self.probes_fallback = self.bpf.probes, self.bpf.fallback
            self.missed_start = self.bpf.misses() if self.bpf is not None else {}
            cpu0 = time.process_time()
            self.start = time.monotonic()
            self.sample("start")
            if req.command:
                self._acks = AckSender()
                child = proc.spawn(
                    req.command,
                    env={**req.env, EVENTS_ENV: str(self.events_path), **self._acks.env()},
                    stdout_to_stderr=req.quiet_stdout,
                    new_session=req.own_group,
                )
                if self.bpf is not None:
                    self.bpf.add_workload(child.pid)
                self.wake.child(child.pid)
            next_tick = req.interval
            stop.arm()  # signals between samples: inside one, the events read for it were lost
            while True:
                stop.check()
                # until the next periodic sample, or sooner: an event written (by the workload,
                # or a thread of ours: iotune.train.swapwatch), the workload's end, a signal
                due = next_tick if req.duration is None else min(next_tick, req.duration)
                self.wake.wait(due - (time.monotonic() - self.start))
                now = time.monotonic() - self.start
                for ev in self._new_events():
                    self.sample(model.event_label(ev))
                    if isinstance(ev.get("ack"), int) and self._acks is not None:
                        self._acks.ack(ev["ack"])  # that rank goes on from here
                if child is not None and child.poll() is not None:
                    self.exit_code = child.returncode
                    break
                if req.duration is not None and now >= req.duration:
                    break
                if now >= next_tick:
                    self.sample("interval")
                    next_tick += req.interval
                    if child is not None and (lost := self.watch.check(now)) is not None:
                        self.lost = lost
                        break
            stop.check()  # a signal that came as the workload ended
        except KeyboardInterrupt:
            self.interrupted = "SIGINT"
        except Terminated:
            self.interrupted = "SIGTERM"
        finally:
            stop.restore()
            if child is not None and child.poll() is None:
                stop_child(
                    child,
                    signal.SIGTERM if self.interrupted == "SIGTERM" else signal.SIGINT,
                    group=req.own_group,
                    patience=3.0 if self.lost else 15.0,  # blocked on the lost path's I/O
                )
            if child is not None:
                self.exit_code = child.returncode
            if self._acks is not None:  # the workload has ended: nobody waits any more
                self._acks.close()
                self._acks = None
            if self.start:
                for ev in self._new_events():
                    self.sample(model.event_label(ev))
                self.sample("end")
                self.tracer_cpu_s = round(time.process_time() - cpu0, 3)
            if self._events is not None:
                self._events.close()
                self._events = None
            self.wake.close()
            if self.bpf is not None:
                # read after the last snapshot (and before it at the start): the window's
                # misses are bounded from above, never missed themselves
                self.missed_end = self.bpf.misses()
                self.bpf_time = bpf_time(self.bpf.programs())
            hist = self.bpf.hist() if self.bpf is not None else {}
            dropped = self.bpf.dropped() if self.bpf is not None else (0, 0, 0, 0)
            # the bios before the first sample are not the window's: taken off, as requests are
            at = self.owners_at
            owners = (
                (model.owners_since(at.get("end", {}), at.get("start", {})), self.bpf.comms())
                if self.bpf is not None
                else ({}, {})
            )
            if self.bpf is not None:
                self.bpf.close()
                self.bpf = None
            result = self.result(hist, dropped, owners) if len(self.samples) >= 2 else None
            if result is not None:
                write_outputs(req.out, result)
        if result is None:
            raise KeyboardInterrupt
        return result

    # ------------------------------------------------------------------ results
    def result(
        self,
        hist: dict[tuple[int, int, int], int],
        dropped: tuple[int, int, int, int],
        owners: tuple[dict[tuple[int, int, int], tuple[int, int]], dict[int, str]] = ({}, {}),
    ) -> dict[str, Any]:
        req = self.req
        first, last = self.samples[0], self.samples[-1]
        counts = model.sub(last.counts, first.counts)
        per_dev: dict[str, dict[str, model.OpStats]] = {}
        missed = {k: v - self.missed_start.get(k, 0) for k, v in self.missed_end.items()}
        devices = []
        chunk_of = {m: a.chunk_bytes for a in req.targets.arrays for m in a.members}
        for name in self.names:
            kernel = last.stats[name] - first.stats[name]
            if traces_requests(req.backend):
                ops = {
                    op: model.op_stats(counts, self.devs[name], i, req.focus)
                    for i, op in enumerate(model.OPS)
                }
            else:
                ops = model.diskstats_only(kernel)
            per_dev[name] = ops
            entry: dict[str, Any] = devinfo(self.tree, name)
            entry["stacked"] = name in req.targets.stacked
            entry["chunk_bytes"] = chunk_of.get(name)
            dev = self.devs[name]
            entry["latency"] = latency.interval(
                first.lat.get(dev),
                last.lat.get(dev),
                last.t - first.t,
                True,
                kernel.time_in_queue_ms,
            )
            for op, st in ops.items():
                entry[op] = opjson(st)
            entry["diskstats"] = diskstats_json(kernel)
            if entry["stacked"]:
                # md/dm are bio-based: diskstats counts bios here, requests exist on members
                entry["check"] = {
                    "exact": None,
                    "summary": "bio-based: requests are counted on its members",
                }
            elif req.only_pid or req.only_cgroup:
                entry["check"] = filt.check(ops, kernel, req.only_pid, req.only_cgroup)
            elif traces_requests(req.backend):
                done = {
                    op: (
                        n - first.done.get((dev, op), (0, 0))[0],
                        sec - first.done.get((dev, op), (0, 0))[1],
                    )
                    for (d, op), (n, sec) in last.done.items()
                    if d == dev
                }
                chk = model.check(
                    ops["read"],
                    ops["write"],
                    kernel,
                    done,
                    inflight_start=first.inflight.get(name, (0, 0)),
                    inflight_end=last.inflight.get(name, (0, 0)),
                    settled=first.settled and last.settled,
                    missed=model.missed_events(missed),
                )
                entry["check"] = check_json(chk, first.settled and last.settled)
                entry["histogram"] = {
                    op: [
                        [*model.slot_range(slot), n]
                        for (d, o, slot), n in sorted(hist.items())
                        if d == self.devs[name] and o == i and n
                    ]
                    for i, op in enumerate(model.OPS)
                }
            devices.append(entry)
        arrays = []
        for a in req.targets.arrays:
            members = [m for m in a.members if m in per_dev]
            entry = {
                "name": a.name,
                "path": f"/dev/{a.name}",
                "level": a.level,
                "chunk_bytes": a.chunk_bytes,
                "members": members,
            }
            for op in model.OPS:
                entry[op] = opjson(model.merge(per_dev[m][op] for m in members))
            arrays.append(entry)
        return {
            "focus_size": req.focus,
            "backend": req.backend,
            "probes": self.probes,
            "probes_fallback": self.probes_fallback,
            "duration_s": round(last.t - first.t, 3),
            "command": req.command,
            "devices": devices,
            "arrays": arrays,
            "steps": self.steps(),
            "samples": len(self.samples),
            "dropped": {
                "sizes": dropped[0],
                "completions": dropped[2],
                "owners": dropped[3],
            },
            "other_io": other_io(owners[0], owners[1], self.devs) if req.command else None,
            "missed_events": {k: v for k, v in missed.items() if v},
            "bpf_time": self.bpf_time,
            "tracer_cpu_s": self.tracer_cpu_s,
            "interrupted": self.interrupted,
            "lost_path": self.lost,
            "exit_code": self.exit_code,
            "out": str(req.out),
            "host": host_facts(),
            **req.meta,
        }

    def steps(self) -> list[dict[str, Any]]:
        """I/O between consecutive step events (and from the start, or the workload's "ready"
        event, to the first)."""
        req = self.req
        return model.step_rows(
            self.samples,
            self.devs,
            req.targets.disks,
            req.focus,
            traces_requests(req.backend),
            READY,
            req.targets.stacked,
            req.primary,
        )
