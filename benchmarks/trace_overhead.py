"""Overhead of request tracing on a high-IOPS workload, measured side by side in one run.

    sudo .venv/bin/python benchmarks/trace_overhead.py [--rounds 5] [--seconds 5]
        [--only throughput|cost|attach ...]

Workload: fio 4 KiB random reads, io_uring, iodepth 32, on a loop device over a file in
/dev/shm (RAM-backed: the drive is never the bottleneck, so tracing cost shows). Each
round runs, in order: untraced, `iotune trace -- fio` (exact sizes, completions and the
bios' submitters), untraced, `iotune trace --duration` beside fio (exact sizes and
completions), untraced, the kernel's blktrace (through ftrace's blk tracer, its events
copied to a file in RAM), untraced, bcc's bitesize, untraced, bpftrace's bitesize.bt.
Each traced run is compared with the untraced run just before it (these hosts are noisy);
the script prints the median, quartiles and range of those ratios per tracer, and the
events blktrace dropped. Around every fio run it also reads the host's CPU time (all CPUs,
/proc/stat: user, nice, system, irq, softirq) and divides it by fio's requests: what a
tracer adds there is its whole cost per request, the kernel's work at the tracepoint
(filling a classic tracepoint's record, running the program) and the tracer's own process
included, whether or not the workload's throughput shows it. (Not for `iotune trace --
CMD`, whose window also holds its start.) Beside `iotune trace`, which reads the block
events with BTF tracepoint programs where the kernel has BTF, the same tracer is held on
classic tracepoints (`--hold DEV --probes tracepoint`, sampling its counters every
second as `iotune trace` does).

`iotune trace --duration` runs with each of its eBPF backends: libbpf (the prebuilt CO-RE
object) and bcc (compiled at start); their attach + detach times are measured too, in
process and alternating (`--only attach`).

Then, with the kernel's BPF statistics on (kernel.bpf_stats_enabled), each BPF tracer's
programs are timed by the kernel itself over an fio run: nanoseconds of BPF per request
and what that is at 250K IOPS as a share of one CPU. Unlike throughput ratios this does not
drift with the host's noise (the statistics add two clock reads per program run, to every
tracer alike).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.loopdev import loop_device

IOTUNE = str(Path(sys.executable).parent / "iotune")


def fio_argv(dev: str, seconds: int) -> list[str]:
    return [
        "fio",
        "--name=rr",
        f"--filename={dev}",
        "--direct=1",
        "--rw=randread",
        "--bs=4k",
        "--ioengine=io_uring",
        "--iodepth=32",
        "--time_based",
        f"--runtime={seconds}",
        "--output-format=json",
    ]


def fio_read(fio_json: str) -> dict[str, float]:
    start = fio_json.index("{")
    return dict(json.loads(fio_json[start:])["jobs"][0]["read"])


def iops(fio_json: str) -> float:
    return float(fio_read(fio_json)["iops"])


@dataclass(frozen=True)
class Run:
    iops: float
    #: the host's CPU time over the fio run per request, ns (None: not measured)
    cpu_ns: float | None


def cpu_busy_ns() -> int:
    """The host's CPU time so far, all CPUs: user, nice, system, irq and softirq (not idle,
    iowait or steal), in ns."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) * 10**9 // os.sysconf("SC_CLK_TCK")


def run_plain(dev: str, seconds: int) -> Run:
    before = cpu_busy_ns()
    out = subprocess.run(fio_argv(dev, seconds), capture_output=True, text=True, check=True).stdout
    busy = cpu_busy_ns() - before
    r = fio_read(out)
    return Run(float(r["iops"]), busy / float(r["total_ios"]))


def hold(dev: str, probes: str) -> None:
    """``--hold``: iotune's tracer on *dev* with the given kind of programs, its counters read
    every second, until SIGINT."""
    from iotune.trace.bpf import ReqSizeTracer
    from iotune.trace.targets import kernel_dev

    st = os.stat(dev)
    tracer = ReqSizeTracer(
        [kernel_dev(os.major(st.st_rdev), os.minor(st.st_rdev))], btf=probes == "tp_btf"
    )
    print(f"holding {dev} with {tracer.probes} programs", flush=True)
    try:
        while True:
            time.sleep(1)
            tracer.counts()
            tracer.done()
    except KeyboardInterrupt:
        pass
    finally:
        tracer.close()


def bpf_progs() -> dict[int, tuple[str, int, int]]:
    """id -> (name, run_time_ns, run_cnt) of every loaded BPF program."""
    out = subprocess.run(
        ["bpftool", "prog", "show", "--json"], capture_output=True, text=True, check=True
    ).stdout
    return {
        int(p["id"]): (
            str(p.get("name", "")),
            int(p.get("run_time_ns", 0)),
            int(p.get("run_cnt", 0)),
        )
        for p in json.loads(out)
    }


def bpf_cost(argv: list[str], dev: str, seconds: int) -> tuple[float, float, list[str]]:
    """(ns of BPF per request, program runs per request, program names) of the tracer
    *argv* over one fio run, from the kernel's own per-program statistics."""
    before = set(bpf_progs())
    with tracing(argv):
        start = {i: v for i, v in bpf_progs().items() if i not in before}
        done = subprocess.run(fio_argv(dev, seconds), capture_output=True, text=True, check=True)
        end = bpf_progs()
    requests = float(fio_read(done.stdout)["total_ios"])
    ns = sum(end[i][1] - v[1] for i, v in start.items() if i in end)
    runs = sum(end[i][2] - v[2] for i, v in start.items() if i in end)
    return ns / requests, runs / requests, sorted(v[0] for v in start.values())


def run_iotune(dev: str, seconds: int, out: Path) -> Run:
    p = subprocess.run(
        [
            IOTUNE,
            "--json",
            "trace",
            "--devices",
            dev,
            "--out",
            str(out),
            "--",
            *fio_argv(dev, seconds),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    # with --json the workload's stdout goes to stderr; fio's JSON is there
    return Run(iops(p.stderr[p.stderr.index('{\n  "fio version"') :]), None)


def iotune_beside(
    dev: str, seconds: int, out: Path, backend: str = "libbpf", *extra: str
) -> list[str]:
    """`iotune trace --duration` on *dev* with *backend*, long enough for an fio run of
    *seconds*; *extra*: more of its options (--no-latency)."""
    return [
        *(IOTUNE, "trace", "--backend", backend, "--devices", dev, *extra),
        *("--duration", str(seconds + 30), "--out", str(out)),
    ]


def attach_times(dev: str, rounds: int) -> dict[str, list[float]]:
    """Seconds from nothing loaded to the programs attached, and to all of it gone again,
    for each eBPF tracer as `iotune trace` opens it (owners on), alternating: libbpf loads
    the prebuilt CO-RE object; bcc compiles the source first."""
    from iotune.trace.bpf import ReqSizeTracer
    from iotune.trace.libbpf import LibbpfTracer
    from iotune.trace.targets import kernel_dev

    st = os.stat(dev)
    kdev = kernel_dev(os.major(st.st_rdev), os.minor(st.st_rdev))
    opens: dict[str, Callable[[], object]] = {
        "libbpf": lambda: LibbpfTracer([kdev], owners=True),
        "bcc": lambda: ReqSizeTracer([kdev], owners=True),
    }
    out: dict[str, list[float]] = {k: [] for k in opens}
    for r in range(rounds):
        for name, open_ in opens.items():
            t0 = time.perf_counter()
            tracer = open_()
            t1 = time.perf_counter()
            tracer.close()  # type: ignore[attr-defined]
            t2 = time.perf_counter()
            out[name].append(t2 - t0)
            print(
                f"attach round {r + 1}: {name}: attach {1000 * (t1 - t0):.0f} ms, "
                f"detach {1000 * (t2 - t1):.0f} ms",
                flush=True,
            )
    return out


@contextmanager
def tracing(argv: list[str]) -> Iterator[None]:
    """The tracer *argv* running (compiled and attached) for the body, stopped after it
    with SIGINT, as a user stops it."""
    tool = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    time.sleep(3)  # compile + attach
    if tool.poll() is not None:
        raise RuntimeError(f"{argv[0]} exited: {tool.communicate()[0][-500:]}")
    try:
        yield
    finally:
        os.killpg(tool.pid, signal.SIGINT)
        tool.communicate(timeout=30)


def held(dev: str, probes: str) -> list[str]:
    return [sys.executable, __file__, "--hold", dev, "--probes", probes]


def run_with_tool(argv: list[str], dev: str, seconds: int) -> Run:
    with tracing(argv):
        return run_plain(dev, seconds)


TRACEFS = Path("/sys/kernel/tracing")


def run_blktrace(dev: str, seconds: int, tmp: Path, drops: list[int]) -> Run:
    """The kernel's blktrace tracer (every issue, completion, merge... of every request)
    through ftrace, its events read from trace_pipe into a file in RAM while fio runs; the
    events the ring buffers overran go to *drops*. The blktrace tool itself reads them from
    debugfs relay files, which kernel lockdown refuses on these hosts; ftrace's "blk"
    tracer is the same in-kernel tracer without debugfs."""
    name = Path(dev).name
    knob = Path(f"/sys/block/{name}/trace/enable")
    was_on = (TRACEFS / "tracing_on").read_text().strip()
    (TRACEFS / "tracing_on").write_text("0")
    (TRACEFS / "current_tracer").write_text("blk")
    (TRACEFS / "trace").write_text("")
    knob.write_text("1")
    sink = (tmp / "blk.trace").open("w")
    reader = subprocess.Popen(["cat", str(TRACEFS / "trace_pipe")], stdout=sink)
    (TRACEFS / "tracing_on").write_text("1")
    try:
        return run_plain(dev, seconds)
    finally:
        (TRACEFS / "tracing_on").write_text("0")
        time.sleep(0.5)
        reader.terminate()
        reader.wait()
        sink.close()
        overrun = 0
        for stats in sorted((TRACEFS / "per_cpu").glob("cpu*/stats")):
            m = re.search(r"^overrun: (\d+)", stats.read_text(), re.M)
            overrun += int(m.group(1)) if m else 0
        drops.append(overrun)
        knob.write_text("0")
        (TRACEFS / "current_tracer").write_text("nop")
        (TRACEFS / "tracing_on").write_text(was_on)  # as it was: other users of ftrace
        (tmp / "blk.trace").unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--cost-rounds", type=int, default=3)
    ap.add_argument("--attach-rounds", type=int, default=5)
    ap.add_argument(
        "--only",
        choices=("throughput", "cost", "attach"),
        action="append",
        help="run only these parts (default: all)",
    )
    ap.add_argument("--hold", metavar="DEV", help=argparse.SUPPRESS)
    ap.add_argument("--probes", choices=("tp_btf", "tracepoint"), default="tp_btf")
    args = ap.parse_args()
    if args.hold:
        hold(args.hold, args.probes)
        return
    # the tracers stop on SIGINT; a shell that started this in the background had it ignored,
    # and an ignored signal stays ignored across exec
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stack = ExitStack()  # closed at the end: the loop device and the runs' folder go
    dev = stack.enter_context(loop_device())
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(dir="/dev/shm")))
    drops: list[int] = []
    tracers: dict[str, Callable[[], Run]] = {
        "iotune trace -- CMD (exact, owners)": lambda: run_iotune(dev, args.seconds, tmp / "trace"),
        "iotune trace --duration, libbpf": lambda: run_with_tool(
            iotune_beside(dev, args.seconds, tmp / f"dur-{time.monotonic_ns()}"), dev, args.seconds
        ),
        "iotune trace --duration, bcc": lambda: run_with_tool(
            iotune_beside(dev, args.seconds, tmp / f"dur-{time.monotonic_ns()}", "bcc"),
            dev,
            args.seconds,
        ),
        "iotune tracer, classic tracepoints": lambda: run_with_tool(
            held(dev, "tracepoint"), dev, args.seconds
        ),
        "blktrace, ftrace blk (every event)": lambda: run_blktrace(dev, args.seconds, tmp, drops),
        "bcc bitesize (log2)": lambda: run_with_tool(["bitesize-bpfcc"], dev, args.seconds),
        "bpftrace bitesize.bt (log2)": lambda: run_with_tool(
            ["bpftrace", "/usr/sbin/bitesize.bt"], dev, args.seconds
        ),
    }
    bpf_tracers = {
        "iotune trace --duration, libbpf": iotune_beside(dev, args.seconds, tmp / "cost"),
        "iotune trace --duration, bcc": iotune_beside(dev, args.seconds, tmp / "cost", "bcc"),
        # sizes only: the requests not timed (the programs' cost before latency and depth)
        "iotune trace --no-latency, libbpf": iotune_beside(
            dev, args.seconds, tmp / "cost", "libbpf", "--no-latency"
        ),
        "iotune trace --no-latency, bcc": iotune_beside(
            dev, args.seconds, tmp / "cost", "bcc", "--no-latency"
        ),
        "iotune tracer, classic tracepoints": held(dev, "tracepoint"),
        "bcc bitesize (log2)": ["bitesize-bpfcc"],
        "bpftrace bitesize.bt (log2)": ["bpftrace", "/usr/sbin/bitesize.bt"],
    }
    ratios: dict[str, list[float]] = {k: [] for k in tracers}
    # the CPU per request a tracer added to the untraced run before it, and that run's
    added: dict[str, list[tuple[float, float]]] = {k: [] for k in tracers}
    costs: dict[str, list[tuple[float, float, list[str]]]] = {k: [] for k in bpf_tracers}
    base_all: list[float] = []
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    parts = set(args.only or ("throughput", "cost", "attach"))
    attach: dict[str, list[float]] = {}
    try:
        run_plain(dev, 2)  # warm-up
        if "attach" in parts:
            attach = attach_times(dev, args.attach_rounds)
        for r in range(args.rounds if "throughput" in parts else 0):
            for name, fn in tracers.items():
                base = run_plain(dev, args.seconds)
                traced = fn()
                base_all.append(base.iops)
                ratios[name].append(traced.iops / base.iops)
                cpu = ""
                if traced.cpu_ns is not None and base.cpu_ns is not None:
                    added[name].append((traced.cpu_ns - base.cpu_ns, base.cpu_ns))
                    cpu = f"; CPU {traced.cpu_ns:,.0f} vs {base.cpu_ns:,.0f} ns/request"
                print(
                    f"round {r + 1}: {name}: {traced.iops:,.0f} IOPS vs untraced "
                    f"{base.iops:,.0f} = {traced.iops / base.iops:.3f}{cpu}",
                    flush=True,
                )
        stats_was = stats.read_text()
        stats.write_text("1\n")
        try:
            for r in range(args.cost_rounds if "cost" in parts else 0):
                for name, argv in bpf_tracers.items():
                    shutil.rmtree(tmp / "cost", ignore_errors=True)
                    costs[name].append(bpf_cost(argv, dev, args.seconds))
                    ns, runs, _ = costs[name][-1]
                    print(
                        f"cost round {r + 1}: {name}: {ns:.0f} ns of BPF per request "
                        f"({runs:.2f} program runs)",
                        flush=True,
                    )
        finally:
            stats.write_text(stats_was)
    finally:
        stack.close()
    print()
    if attach:
        lb, bc = statistics.median(attach["libbpf"]), statistics.median(attach["bcc"])
        print(
            f"attach + detach (median of {len(attach['bcc'])}): libbpf {1000 * lb:.0f} ms, "
            f"bcc {1000 * bc:.0f} ms: libbpf/bcc = {lb / bc:.3f}"
        )
    if not base_all:
        print_costs(costs)
        return
    print(f"untraced median: {statistics.median(base_all):,.0f} IOPS ({len(base_all)} runs)")
    print(f"{'tracer':<36} {'median traced/untraced':>24} {'overhead':>9}  (quartiles; min..max)")
    for name, rs in ratios.items():
        m = statistics.median(rs)
        q1, _, q3 = statistics.quantiles(rs, n=4) if len(rs) > 1 else (m, m, m)
        print(
            f"{name:<36} {m:>24.3f} {100 * (1 - m):>8.1f}%  "
            f"({q1:.3f}..{q3:.3f}; {min(rs):.3f}..{max(rs):.3f})"
        )
    print(f"blktrace: events the ring buffers overran per run: {drops}")
    print()
    base_cpu = statistics.median(b for v in added.values() for _, b in v)
    print(f"untraced: {base_cpu:,.0f} ns of the host's CPU per request (median)")
    print(
        f"{'tracer':<36} {'CPU added ns/request':>21} {'of untraced':>12} "
        f"{'one CPU at 250K IOPS':>21}  (quartiles; min..max, ns)"
    )
    for name, pairs in added.items():
        if not pairs:
            continue
        extra = [a for a, _ in pairs]
        m = statistics.median(extra)
        q1, _, q3 = statistics.quantiles(extra, n=4) if len(extra) > 1 else (m, m, m)
        share = statistics.median(a / b for a, b in pairs)
        print(
            f"{name:<36} {m:>21.0f} {100 * share:>11.1f}% {100 * m * 250e3 / 1e9:>20.2f}%"
            f"  ({q1:.0f}..{q3:.0f}; {min(extra):.0f}..{max(extra):.0f})"
        )
    print_costs(costs)


def print_costs(costs: dict[str, list[tuple[float, float, list[str]]]]) -> None:
    if not any(costs.values()):
        return
    print()
    print(
        f"{'tracer':<36} {'BPF ns/request':>15} {'runs/request':>13} {'one CPU at 250K IOPS':>21}"
    )
    for name, cs in costs.items():
        ns = statistics.median(c[0] for c in cs)
        runs = statistics.median(c[1] for c in cs)
        print(
            f"{name:<36} {ns:>15.0f} {runs:>13.2f} {100 * ns * 250e3 / 1e9:>20.2f}%"
            f"  ({min(c[0] for c in cs):.0f}..{max(c[0] for c in cs):.0f} ns; "
            f"{', '.join(cs[-1][2])})"
        )


if __name__ == "__main__":
    main()
