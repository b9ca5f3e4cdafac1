"""What iotune's tracer costs a high-IOPS workload, measured by switching its programs on and
off under one continuous fio run.

    sudo .venv/bin/python benchmarks/trace_toggle.py [--seconds 120] [--slice 1]

Separate fio runs on these hosts differ by ±10-20% from one to the next, more than a
tracer costs. Here one fio job (4 KiB random reads, io_uring, iodepth 32, on a loop
device over a file in /dev/shm) runs for the whole time, and the tracer's block programs
are attached and detached in turn every --slice seconds (A B B A, so a steady drift
cancels). A slice's throughput is the reads the drive completed in it
(/sys/block/DEV/stat), its CPU the host's busy time (/proc/stat). Each traced slice is
compared with the mean of the untraced slices either side of it; the script prints the
median and quartiles of those ratios, for iotune's BTF tracepoint programs, for the same
tracer on classic tracepoints, and for a control that switches nothing (the tracer loaded,
never attached: what the method reads where there is nothing to find), one after the other
(--probes picks), each with its counters read every second as `iotune trace` does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.trace_overhead import cpu_busy_ns, fio_argv
from iotune.trace.bpf import ReqSizeTracer
from iotune.trace.targets import kernel_dev


def reads_done(name: str) -> int:
    return int(Path(f"/sys/block/{name}/stat").read_text().split()[0])


def measure(
    dev: str, probes: str, seconds: float, slice_s: float
) -> tuple[list[tuple[float, float]], float]:
    """(traced/untraced throughput, traced/untraced CPU per request) per traced slice, and
    the untraced slices' median IOPS."""
    name = Path(dev).name
    st = os.stat(dev)
    tracer = ReqSizeTracer(
        [kernel_dev(os.major(st.st_rdev), os.minor(st.st_rdev))], btf=probes != "tracepoint"
    )
    control = probes == "none"  # loaded, never attached: what the method itself reads
    if not control and tracer.probes != probes:
        raise SystemExit(f"asked for {probes} programs, the tracer loaded {tracer.probes}")
    tracer.switch(False)
    fio = subprocess.Popen(
        fio_argv(dev, int(seconds) + 5), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
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
            reqs = max(r1 - r0, 1)
            slices.append((on, reqs / (t1 - t0), (c1 - c0) / reqs))
    finally:
        fio.send_signal(signal.SIGINT)
        fio.wait(timeout=30)
        tracer.close()
    out = []
    for i, (on, iops, cpu) in enumerate(slices):
        if not on:
            continue
        # the nearest untraced slice before and after
        before = next((s for s in reversed(slices[:i]) if not s[0]), None)
        after = next((s for s in slices[i + 1 :] if not s[0]), None)
        near = [s for s in (before, after) if s is not None]
        if not near:
            continue
        base_iops = statistics.fmean(s[1] for s in near)
        base_cpu = statistics.fmean(s[2] for s in near)
        out.append((iops / base_iops, cpu / base_cpu))
    return out, statistics.median(s[1] for s in slices if not s[0])


def summary(values: list[float]) -> str:
    m = statistics.median(values)
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{m:.4f} ({q1:.4f}..{q3:.4f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=120.0, help="per kind of programs")
    ap.add_argument("--slice", type=float, default=1.0)
    ap.add_argument("--probes", default="tp_btf,tracepoint,none")
    ap.add_argument("--rounds", type=int, default=1, help="kinds alternate round by round")
    args = ap.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tmp = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="iotune-toggle-"))
    img = tmp / "ram.img"
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={img}", "bs=1M", "count=1024", "status=none"], check=True
    )
    dev = subprocess.run(
        ["losetup", "--find", "--show", str(img)], capture_output=True, text=True, check=True
    ).stdout.strip()
    kinds = args.probes.split(",")
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    try:
        for r in range(args.rounds):
            for kind in kinds:
                pairs, untraced = measure(dev, kind, args.seconds, args.slice)
                results[kind] += pairs
                print(
                    f"round {r + 1}: {kind}: untraced {untraced:,.0f} IOPS; "
                    f"{len(pairs)} traced slices, throughput "
                    f"{summary([p[0] for p in pairs])}, CPU/request "
                    f"{summary([p[1] for p in pairs])}",
                    flush=True,
                )
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print(
        f"{'programs':<12} {'slices':>6}  {'throughput traced/untraced':>30}  "
        f"{'CPU per request traced/untraced':>32}   (median, quartiles)"
    )
    for kind, pairs in results.items():
        print(
            f"{kind:<12} {len(pairs):>6}  {summary([p[0] for p in pairs]):>30}  "
            f"{summary([p[1] for p in pairs]):>32}"
        )


if __name__ == "__main__":
    main()
