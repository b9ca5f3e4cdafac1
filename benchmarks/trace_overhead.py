"""Overhead of request tracing on a high-IOPS workload, measured side by side in one run.

    sudo .venv/bin/python benchmarks/trace_overhead.py [--rounds 5] [--seconds 5]

Workload: fio 4 KiB random reads, io_uring, iodepth 32, on a loop device over a file in
/dev/shm (RAM-backed: the drive is never the bottleneck, so tracing cost shows). Each
round runs, in order: untraced, `iotune trace -- fio` (exact sizes, completions and the
bios' submitters), untraced, `iotune trace --duration` beside fio (exact sizes and
completions), untraced, the kernel's blktrace (through ftrace's blk tracer, its events
copied to a file in RAM), untraced, bcc's bitesize, untraced, bpftrace's bitesize.bt.
Each traced run is compared with the untraced run just before it (these hosts are noisy);
the script prints the median, quartiles and range of those ratios per tracer, and the
events blktrace dropped.
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
from pathlib import Path

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


def iops(fio_json: str) -> float:
    start = fio_json.index("{")
    return float(json.loads(fio_json[start:])["jobs"][0]["read"]["iops"])


def run_plain(dev: str, seconds: int) -> float:
    return iops(
        subprocess.run(fio_argv(dev, seconds), capture_output=True, text=True, check=True).stdout
    )


def run_iotune(dev: str, seconds: int, out: Path) -> float:
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
    return iops(p.stderr[p.stderr.index('{\n  "fio version"') :])


def run_with_tool(argv: list[str], dev: str, seconds: int) -> float:
    tool = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    time.sleep(3)  # compile + attach
    if tool.poll() is not None:
        raise RuntimeError(f"{argv[0]} exited: {tool.communicate()[0][-500:]}")
    try:
        return run_plain(dev, seconds)
    finally:
        os.killpg(tool.pid, signal.SIGINT)
        tool.communicate(timeout=30)


TRACEFS = Path("/sys/kernel/tracing")


def run_blktrace(dev: str, seconds: int, tmp: Path, drops: list[int]) -> float:
    """The kernel's blktrace tracer (every issue, completion, merge... of every request)
    through ftrace, its events read from trace_pipe into a file in RAM while fio runs; the
    events the ring buffers overran go to *drops*. The blktrace tool itself reads them from
    debugfs relay files, which kernel lockdown refuses on these hosts; ftrace's "blk"
    tracer is the same in-kernel tracer without debugfs."""
    name = Path(dev).name
    knob = Path(f"/sys/block/{name}/trace/enable")
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
        (tmp / "blk.trace").unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="iotune-bench-"))
    img = tmp / "ram.img"
    with img.open("wb") as fh:
        fh.truncate(1 << 30)
    subprocess.run(
        ["dd", "if=/dev/zero", f"of={img}", "bs=1M", "count=1024", "status=none"], check=True
    )
    dev = subprocess.run(
        ["losetup", "--find", "--show", str(img)], capture_output=True, text=True, check=True
    ).stdout.strip()
    drops: list[int] = []
    tracers = {
        "iotune trace -- CMD (exact, owners)": lambda: run_iotune(dev, args.seconds, tmp / "trace"),
        "iotune trace --duration (exact)": lambda: run_with_tool(
            [
                IOTUNE,
                "trace",
                "--devices",
                dev,
                "--duration",
                str(args.seconds + 30),
                "--out",
                str(tmp / f"dur-{time.monotonic_ns()}"),
            ],
            dev,
            args.seconds,
        ),
        "blktrace, ftrace blk (every event)": lambda: run_blktrace(dev, args.seconds, tmp, drops),
        "bcc bitesize (log2)": lambda: run_with_tool(["bitesize-bpfcc"], dev, args.seconds),
        "bpftrace bitesize.bt (log2)": lambda: run_with_tool(
            ["bpftrace", "/usr/sbin/bitesize.bt"], dev, args.seconds
        ),
    }
    ratios: dict[str, list[float]] = {k: [] for k in tracers}
    base_all: list[float] = []
    try:
        run_plain(dev, 2)  # warm-up
        for r in range(args.rounds):
            for name, fn in tracers.items():
                base = run_plain(dev, args.seconds)
                traced = fn()
                base_all.append(base)
                ratios[name].append(traced / base)
                print(
                    f"round {r + 1}: {name}: {traced:,.0f} IOPS vs untraced {base:,.0f} "
                    f"= {traced / base:.3f}",
                    flush=True,
                )
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    print()
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


if __name__ == "__main__":
    main()
