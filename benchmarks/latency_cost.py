"""What timing every request costs the tracer, by the kernel's clock, side by side in one run.

    sudo .venv/bin/python benchmarks/latency_cost.py [--rounds 3] [--seconds 4]

Workload: fio 4 KiB random reads, io_uring, iodepth 32, on a loop device over a file in
/dev/shm (RAM-backed: the drive is never the bottleneck, so the programs' cost shows). Each
round loads, in turn, iotune's tracer with libbpf and with bcc, each with its latency and
depth (the default) and without (`--no-latency`: the exact sizes and completions alone),
and bcc's biolatency (libbpf-tools, the reference for latency histograms), with the
kernel's BPF statistics on (kernel.bpf_stats_enabled): each one's programs' run_time_ns
summed over fio's run, divided by fio's requests. Printed: the median over rounds of the
nanoseconds of BPF per request, and each tracer's ratio to iotune's sizes-only programs of
the same backend.

With ``--floor``, each round also loads the programs of benchmarks/bpf/latency_floor.bpf.c
(compiled here with clang): what the least tracer that times each request from its issue to
its completion and counts the depth at each issue must run (the kernel's clock read at both
ends, an atomic add on a counter the CPUs share), less what an empty program costs. Added to
the sizes-only programs, that is the lowest cost any such tracer can have on this host, and
the ratio it gives is the lowest any can reach.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.loopdev import loop_device
from iotune.trace.bpf import ReqSizeTracer
from iotune.trace.libbpf import LibbpfTracer
from iotune.trace.mapreader import prog_info
from iotune.trace.targets import kernel_dev

STATS = Path("/proc/sys/kernel/bpf_stats_enabled")
FLOOR_SRC = Path(__file__).resolve().parent / "bpf" / "latency_floor.bpf.c"
FLOOR_VARIANTS = ("EMPTY", "CLOCK", "FLOOR")
BIOLATENCY = "/usr/sbin/biolatency"


def fio(dev: str, seconds: int) -> int:
    argv = [
        "fio", "--name=job", f"--filename={dev}", "--rw=randread", "--bs=4k", "--direct=1",
        "--ioengine=io_uring", "--iodepth=32", f"--runtime={seconds}", "--time_based",
        "--output-format=json",
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return int(json.loads(out)["jobs"][0]["read"]["total_ios"])


def ours(make: Callable[[], Any], dev: str, seconds: int) -> float:
    tracer = make()
    try:
        ios = fio(dev, seconds)
        ns = sum(prog_info(fd).get("run_time_ns", 0) for _, fd in tracer.programs())
    finally:
        tracer.close()
    return ns / ios


def bpftool_ns(prefix: tuple[str, ...]) -> int:
    argv = ["bpftool", "-j", "prog", "show"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    progs = json.loads(out.stdout or "[]")
    return sum(int(p.get("run_time_ns", 0)) for p in progs if p.get("name", "").startswith(prefix))


def biolatency(dev: str, seconds: int) -> float:
    p = subprocess.Popen(
        ["stdbuf", "-oL", BIOLATENCY, "-d", Path(dev).name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert p.stdout is not None
        p.stdout.readline()  # attached
        ios = fio(dev, seconds)
        ns = bpftool_ns(("block_rq", "blk_account"))
    finally:
        p.terminate()
        p.wait(timeout=30)
    return ns / ios


def build_floor(out: Path) -> dict[str, Path]:
    """The floor programs, one object a variant (clang, as bpf/build.sh builds iotune's)."""
    arch = os.uname().machine
    objs = {}
    for v in FLOOR_VARIANTS:
        obj = out / f"floor_{v}.o"
        argv = [
            "clang-14", "-g", "-O2", "-target", "bpf", "-mcpu=v3",
            f"-D__TARGET_ARCH_{arch.replace('x86_64', 'x86').replace('aarch64', 'arm64')}",
            f"-D{v}", "-I", f"/usr/include/{arch}-linux-gnu", "-c", str(FLOOR_SRC), "-o", str(obj),
        ]  # fmt: skip
        subprocess.run(argv, check=True)
        objs[v] = obj
    return objs


def floor(obj: Path, dev: str, seconds: int) -> float:
    """fio under one floor variant's programs: their BPF ns per request."""
    from iotune.trace.libbpf import lib

    so = lib()
    o = so.bpf_object__open_file(str(obj).encode(), None)
    if not o:
        raise RuntimeError(f"opening {obj}")
    links = []
    try:
        if so.bpf_object__load(o):
            raise RuntimeError(f"loading {obj}")
        progs, prog = [], so.bpf_object__next_program(o, None)
        while prog:
            progs.append(prog)
            prog = so.bpf_object__next_program(o, prog)
        for prog in progs:
            link = so.bpf_program__attach(prog)
            if not link:
                raise RuntimeError(f"attaching a program of {obj}")
            links.append(link)
        ios = fio(dev, seconds)
        ns = sum(prog_info(int(so.bpf_program__fd(q))).get("run_time_ns", 0) for q in progs)
    finally:
        for link in links:
            so.bpf_link__destroy(link)
        so.bpf_object__close(o)
    return ns / ios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=4)
    ap.add_argument("--floor", action="store_true", help="also the floor programs (see above)")
    args = ap.parse_args()
    old = STATS.read_text().strip()
    results: dict[str, list[float]] = {}
    with loop_device("/dev/shm", mib=256) as dev:  # noqa: S108 - RAM, on purpose
        st = os.stat(dev)
        kd = kernel_dev(os.major(st.st_rdev), os.minor(st.st_rdev))
        tracers: dict[str, Callable[[], float]] = {
            "libbpf, sizes only": lambda: ours(lambda: LibbpfTracer([kd], latency=False), dev, args.seconds),
            "libbpf, with latency": lambda: ours(lambda: LibbpfTracer([kd]), dev, args.seconds),
            "bcc, sizes only": lambda: ours(lambda: ReqSizeTracer([kd], latency=False), dev, args.seconds),
            "bcc, with latency": lambda: ours(lambda: ReqSizeTracer([kd]), dev, args.seconds),
            "bcc's biolatency (libbpf-tools)": lambda: biolatency(dev, args.seconds),
        }  # fmt: skip
        if args.floor:
            tmp = Path(tempfile.mkdtemp(prefix="iotune-floor-"))
            for v, obj in build_floor(tmp).items():
                tracers[f"floor: {v.lower()}"] = lambda obj=obj: floor(obj, dev, args.seconds)  # type: ignore[misc]
        fio(dev, 2)  # warm-up
        try:
            STATS.write_text("1")
            for r in range(args.rounds):
                for name, run in tracers.items():
                    results.setdefault(name, []).append(run())
                    print(f"round {r + 1}: {name}: {results[name][-1]:.0f} ns", file=sys.stderr)
                    time.sleep(0.5)
        finally:
            STATS.write_text(old)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"{'tracer':<34} {'BPF ns/request':>15} {'vs sizes only':>14}  (range)")
    for name, ns in med.items():
        base = med["bcc, sizes only" if name.startswith("bcc,") else "libbpf, sizes only"]
        print(
            f"{name:<34} {ns:>15.0f} {ns / base:>13.2f}x  "
            f"({min(results[name]):.0f}..{max(results[name]):.0f})"
        )
    if args.floor:
        sizes = med["libbpf, sizes only"]
        extra = med["floor: floor"] - med["floor: empty"]
        clock = med["floor: clock"] - med["floor: empty"]
        print(
            f"the floor: two clock reads and the shared in-flight count add {extra:.0f} ns a "
            f"request ({clock:.0f} ns of it the clock) to what a program costs; the least a "
            f"tracer that times and counts depth can cost: {sizes + extra:.0f} ns, "
            f"{(sizes + extra) / sizes:.2f}x the sizes-only programs (goal 1.25x)"
        )


if __name__ == "__main__":
    main()
