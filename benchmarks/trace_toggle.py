"""What iotune's tracer costs a high-IOPS workload, measured by switching its programs on and
off under one continuous fio run.

    sudo .venv/bin/python benchmarks/trace_toggle.py [--seconds 120] [--slice 1]

Separate fio runs on these hosts differ by ±10-20% from one to the next, more than a
tracer costs. Here one fio job (4 KiB random reads, io_uring, iodepth 32, on a loop
device over a file in /dev/shm) runs for the whole time, and the tracer's block programs
are attached and detached in turn every --slice seconds (A B B A, so a steady drift
cancels). A slice's throughput is the reads the drive completed in it
(/sys/block/DEV/stat), its CPU the host's busy time (/proc/stat). In each cycle the two
traced slices are compared with the two untraced ones around them; the script prints the
median of the cycles' ratios with its 95% confidence interval (distribution-free, from the
order statistics) and quartiles, one after the other (--probes picks) for:
- ``tp_btf``: iotune's BTF tracepoint programs (what ``iotune trace`` loads where the
  kernel has BTF), its counters read every second as ``iotune trace`` does;
- ``tracepoint``: the same tracer on classic tracepoints;
- ``empty``: two programs that do nothing, attached the way the BTF ones are (raw
  tracepoints on issue and completion: the same dispatch): what any BPF tracer of these
  two events costs at least;
- ``issue``: iotune's BTF program on the issue event alone (completion and requeue left
  off): what counting request sizes would cost without the completions that check them;
- ``empty1``: one program that does nothing, on the issue event: the floor of ``issue``
  (and of any tracer of one event, bpftrace's bitesize.bt among them);
- ``none``: a control that switches nothing (the tracer loaded, never attached): what the
  method reads where there is nothing to find.

With --cost-seconds, each kind's programs then run that long with the kernel's BPF
statistics on (kernel.bpf_stats_enabled): their time per request by the kernel's clock
(which adds a clock read per program run, to every kind alike), and that time as a share of
the host's CPU per request without them.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.loopdev import loop_device
from benchmarks.trace_overhead import cpu_busy_ns, fio_argv
from iotune.trace.bpf import ReqSizeTracer
from iotune.trace.mapreader import prog_info
from iotune.trace.targets import kernel_dev


def reads_done(name: str) -> int:
    return int(Path(f"/sys/block/{name}/stat").read_text().split()[0])


EMPTY = b"""
RAW_TRACEPOINT_PROBE(block_rq_issue) { return 0; }
RAW_TRACEPOINT_PROBE(block_rq_complete) { return 0; }
"""


class Empty:
    """Two programs that do nothing on issue and completion, switched like the tracer's."""

    EVENTS: tuple[bytes, ...] = (b"block_rq_issue", b"block_rq_complete")

    def __init__(self) -> None:
        import bcc

        self.bpf = bcc.BPF(text=EMPTY)  # attached on load
        self.probes = "empty"

    def switch(self, on: bool) -> None:
        for tp in self.EVENTS:
            attached = tp in self.bpf.raw_tracepoint_fds
            if on and not attached:
                self.bpf.attach_raw_tracepoint(tp=tp, fn_name=b"raw_tracepoint__" + tp)
            elif not on and attached:
                self.bpf.detach_raw_tracepoint(tp)

    def prog_fds(self) -> list[int]:
        return [self.bpf.funcs[b"raw_tracepoint__" + tp].fd for tp in self.EVENTS]

    def counts(self) -> None:
        pass

    def done(self) -> None:
        pass

    def close(self) -> None:
        self.bpf.cleanup()


class EmptyIssue(Empty):
    """One program that does nothing, on the issue event."""

    EVENTS = (b"block_rq_issue",)


class IssueOnly:
    """iotune's BTF programs with only the issue program switched on."""

    EVENTS = ("block_rq_issue",)

    def __init__(self, tracer: ReqSizeTracer) -> None:
        self.tracer = tracer
        tracer.switch(False)
        self.switch(True)  # attached on construction, as the others are
        self.probes = "issue"

    def switch(self, on: bool) -> None:
        self.tracer.switch(on, events=self.EVENTS)

    def prog_fds(self) -> list[int]:
        return [fd for label, fd in self.tracer.programs() if label == "block:block_rq_issue"]

    def counts(self) -> None:
        self.tracer.counts()

    def done(self) -> None:
        self.tracer.done()

    def close(self) -> None:
        self.tracer.close()


def tracer_for(dev: str, probes: str) -> Any:
    if probes == "empty":
        return Empty()
    if probes == "empty1":
        return EmptyIssue()
    st = os.stat(dev)
    tracer = ReqSizeTracer(
        [kernel_dev(os.major(st.st_rdev), os.minor(st.st_rdev))], btf=probes != "tracepoint"
    )
    if probes == "issue":
        return IssueOnly(tracer)
    if probes not in ("none", tracer.probes):
        raise SystemExit(f"asked for {probes} programs, the tracer loaded {tracer.probes}")
    return tracer


def prog_fds(tracer: Any) -> list[int]:
    """The block event programs' fds (the raw tracepoints that count skips left out)."""
    if isinstance(tracer, (Empty, IssueOnly)):
        return tracer.prog_fds()
    return [fd for label, fd in tracer.programs() if label.startswith("block:")]


def prog_stats(fds: list[int]) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over programs."""
    infos = [prog_info(fd) for fd in fds]
    return sum(i.get("run_time_ns", 0) for i in infos), sum(i.get("run_cnt", 0) for i in infos)


def measure(
    dev: str, probes: str, seconds: float, slice_s: float
) -> tuple[list[tuple[float, float]], float, float]:
    """(traced/untraced throughput, traced/untraced CPU per request) per cycle, and the
    untraced slices' median IOPS and host CPU ns per request."""
    name = Path(dev).name
    tracer = tracer_for(dev, probes)
    control = probes == "none"  # loaded, never attached: what the method itself reads
    tracer.switch(False)
    # switching and sampling add to every slice: fio runs on well past the slices' time,
    # and is stopped when they are done
    fio = subprocess.Popen(
        fio_argv(dev, int(seconds * 1.5) + 10),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    slices: list[tuple[bool, float, float]] = []  # (traced, IOPS, CPU ns per request)
    try:
        time.sleep(2)  # past fio's start
        pattern = (False, True, True, False)
        n = int(seconds / slice_s)
        for i in range(n):
            on = pattern[i % 4]
            tracer.switch(on and not control)
            r0, c0, t0 = reads_done(name), cpu_busy_ns(), time.monotonic()
            time.sleep(slice_s)
            if on:
                tracer.counts()  # as iotune samples its counters
                tracer.done()
            r1, c1, t1 = reads_done(name), cpu_busy_ns(), time.monotonic()
            if fio.poll() is not None:
                raise SystemExit(f"fio ended after {i} slices: slices took longer than it ran")
            reqs = max(r1 - r0, 1)
            slices.append((on, reqs / (t1 - t0), (c1 - c0) / reqs))
    finally:
        fio.send_signal(signal.SIGINT)
        fio.wait(timeout=30)
        tracer.close()
    # one ratio per A B B A cycle (the two traced slices against the two untraced ones
    # around them): cycles share no slice, so their ratios are independent samples
    out = []
    for c in range(0, len(slices) - 3, 4):
        off, on_ = (slices[c], slices[c + 3]), slices[c + 1 : c + 3]
        out.append(
            (
                statistics.fmean(s[1] for s in on_) / statistics.fmean(s[1] for s in off),
                statistics.fmean(s[2] for s in on_) / statistics.fmean(s[2] for s in off),
            )
        )
    untraced = [s for s in slices if not s[0]]
    return out, statistics.median(s[1] for s in untraced), statistics.median(s[2] for s in untraced)


def bpf_ns(dev: str, probes: str, seconds: float) -> tuple[float, float]:
    """(ns of BPF per request, program runs per request) of *probes* under the fio job, with
    the kernel's BPF statistics on."""
    name = Path(dev).name
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    was = stats.read_text()
    tracer = tracer_for(dev, probes)
    fio = subprocess.Popen(
        fio_argv(dev, int(seconds) + 5), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(2)
        stats.write_text("1\n")
        fds = prog_fds(tracer)
        (ns0, n0), r0 = prog_stats(fds), reads_done(name)
        time.sleep(seconds)
        (ns1, n1), r1 = prog_stats(fds), reads_done(name)
    finally:
        stats.write_text(was)
        fio.send_signal(signal.SIGINT)
        fio.wait(timeout=30)
        tracer.close()
    reqs = max(r1 - r0, 1)
    return (ns1 - ns0) / reqs, (n1 - n0) / reqs


def median_ci(values: list[float]) -> tuple[float, float] | None:
    """A 95% confidence interval of the median from the order statistics (no assumption
    about the distribution): the k-th smallest and largest values, k the largest with
    P(Binomial(n, 1/2) < k) <= 2.5%. None where n is too small for one (n < 6)."""
    v = sorted(values)
    n = len(v)
    k, tail = 0, 0.0
    while k < n:
        nxt = tail + math.comb(n, k) / 2**n
        if nxt > 0.025:
            break
        tail, k = nxt, k + 1
    return None if k == 0 else (v[k - 1], v[n - k])


def summary(values: list[float]) -> str:
    if len(values) < 2:
        return "n/a (fewer than 2 cycles)"
    m = statistics.median(values)
    ci = median_ci(values)
    q1, _, q3 = statistics.quantiles(values, n=4)
    interval = f"[{ci[0]:.4f}..{ci[1]:.4f}]" if ci else "[n/a]"
    return f"{m:.4f} {interval} ({q1:.4f}..{q3:.4f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120.0, help="per kind of programs")
    ap.add_argument("--slice", type=float, default=1.0)
    ap.add_argument("--probes", default="tp_btf,tracepoint,empty,none")
    ap.add_argument("--rounds", type=int, default=1, help="kinds alternate round by round")
    ap.add_argument("--cost-seconds", type=float, default=0.0)
    args = ap.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stack = ExitStack()
    dev = stack.enter_context(loop_device())
    kinds = args.probes.split(",")
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    costs: dict[str, tuple[float, float]] = {}
    base_cpu: list[float] = []  # untraced host CPU ns per request, per measurement
    try:
        for r in range(args.rounds):
            for kind in kinds:
                pairs, untraced, cpu = measure(dev, kind, args.seconds, args.slice)
                results[kind] += pairs
                base_cpu.append(cpu)
                print(
                    f"round {r + 1}: {kind}: untraced {untraced:,.0f} IOPS, {cpu:,.0f} ns of "
                    f"host CPU per request; {len(pairs)} cycles, throughput "
                    f"{summary([p[0] for p in pairs])}, CPU/request "
                    f"{summary([p[1] for p in pairs])}",
                    flush=True,
                )
        if args.cost_seconds:
            for kind in (k for k in kinds if k != "none"):
                costs[kind] = bpf_ns(dev, kind, args.cost_seconds)
                print(f"{kind}: {costs[kind][0]:.0f} ns of BPF per request", flush=True)
    finally:
        stack.close()
    print()
    print(
        f"{'programs':<12} {'cycles':>6}  {'throughput traced/untraced':>40}  "
        f"{'CPU per request traced/untraced':>40}"
    )
    print(f"{'':<12} {'':>6}  {'median [95% CI] (quartiles)':>40}  {'':>40}")
    for kind, pairs in results.items():
        print(
            f"{kind:<12} {len(pairs):>6}  {summary([p[0] for p in pairs]):>40}  "
            f"{summary([p[1] for p in pairs]):>40}"
        )
    if costs:
        cpu = statistics.median(base_cpu)
        print()
        print(f"untraced: {cpu:,.0f} ns of the host's CPU per request (median)")
        print(
            f"{'programs':<12} {'BPF ns/request':>15} {'runs/request':>13} "
            f"{'of untraced CPU':>16}  (kernel's clock)"
        )
        for kind, (ns, runs) in costs.items():
            print(f"{kind:<12} {ns:>15.0f} {runs:>13.2f} {100 * ns / cpu:>15.2f}%")


if __name__ == "__main__":
    main()
