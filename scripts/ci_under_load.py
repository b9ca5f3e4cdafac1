#!/usr/bin/env python3
"""Run `.ci/run` on a fresh clone with work beside it, as a user's workstation or a shared CI
runner has: the suite must pass on what the program did, never on a quiet machine.

    scripts/ci_under_load.py                       # quiet: the clone alone
    scripts/ci_under_load.py --cpu 1               # one CPU-bound loop at nice 0
    scripts/ci_under_load.py --cpu 1 --io          # and a steady O_DIRECT writer on the root disk
    scripts/ci_under_load.py --mem                 # page-cache pressure
    scripts/ci_under_load.py --bursty              # those and a developer's commands, in bursts

The clone is made under --where (default /tmp: the vm tier's guests see the host's /tmp) from
this checkout's HEAD; the load runs in its own process group and ends with the run. The last
line says the result and the wall time, which benchmarks/RESULTS.md records. Root, as .ci/run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
#: the load's jitter: system entropy, so forked children do not share one sequence
_RNG = random.SystemRandom()


def cpu_loop() -> None:
    """One core's worth of arithmetic, at nice 0."""
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def io_writer(folder: Path, burst: bool) -> None:
    """A steady (or bursty) O_DIRECT writer of 1 MiB blocks on the root disk, cycling over a
    256 MiB file, never on the devices under test."""
    import mmap

    path = folder / "io-load.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    buf = mmap.mmap(-1, 1 << 20)
    buf.write(os.urandom(1 << 20))
    off = 0
    try:
        while True:
            os.pwritev(fd, [buf], off)
            off = (off + (1 << 20)) % (256 << 20)
            if burst and off == 0:
                time.sleep(_RNG.uniform(2, 10))
    finally:
        os.close(fd)


def mem_pressure(folder: Path, burst: bool) -> None:
    """Page-cache pressure: a 2 GiB file written, then read through the cache over and over,
    pushing the suite's files out of it."""
    path = folder / "mem-load.bin"
    block = os.urandom(1 << 20)
    with path.open("wb") as fh:
        for _ in range(2048):
            fh.write(block)
    while True:
        with path.open("rb") as fh:
            while fh.read(1 << 20):
                pass
        if burst:
            time.sleep(_RNG.uniform(2, 15))


def tools(venv: Path) -> None:
    """What a developer runs beside a test run: a fresh interpreter importing torch,
    transformers and DeepSpeed (CPU, memory, the page cache), then `iotune --help` and an
    `iotune estimate`, over and over (the clone's own virtualenv, once the set-up made it)."""
    python, iotune = venv / "bin" / "python", venv / "bin" / "iotune"
    while True:
        if not iotune.exists():
            time.sleep(5)
            continue
        for argv in (
            [str(python), "-c", "import torch, transformers, deepspeed"],
            [str(iotune), "--help"],
            [str(iotune), "estimate", "opt_nvme_1b"],
        ):
            subprocess.run(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
                preexec_fn=_die_with_parent,  # no thread here
            )


def _die_with_parent() -> None:
    """SIGKILL when the process that started this one dies (the burst's end, the run's)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)


def bursty(folder: Path, venv: Path) -> None:
    """CPU, I/O, memory and a developer's own commands in bursts: each child runs for 5-40 s,
    then rests 5-30 s, like the imports, downloads and builds beside a developer's test run.
    A command a child started dies with it."""
    kinds = ("cpu", "io", "mem", "tools")
    while True:
        kind = _RNG.choice(kinds)
        pid = os.fork()
        if pid == 0:
            if kind == "cpu":
                cpu_loop()
            elif kind == "io":
                io_writer(folder, burst=False)
            elif kind == "mem":
                mem_pressure(folder, burst=False)
            else:
                tools(venv)
            os._exit(0)
        time.sleep(_RNG.uniform(5, 40))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        time.sleep(_RNG.uniform(5, 30))


def start(fn: object, *args: object) -> int:
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        fn(*args)  # type: ignore[operator]
        os._exit(0)
    return pid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", type=int, default=0, metavar="N", help="N CPU-bound loops at nice 0")
    ap.add_argument("--io", action="store_true", help="a steady O_DIRECT writer on the root disk")
    ap.add_argument("--mem", action="store_true", help="pressure on the page cache")
    ap.add_argument(
        "--bursty",
        action="store_true",
        help="CPU, I/O, memory and a developer's commands (torch imports, iotune) in bursts",
    )
    ap.add_argument(
        "--where", type=Path, default=Path(tempfile.gettempdir()), help="where the clone is made"
    )
    ap.add_argument("--keep", action="store_true", help="keep the clone")
    args = ap.parse_args()
    clone = Path(tempfile.mkdtemp(prefix="iotune-ci-", dir=args.where))
    load_dir = Path(tempfile.mkdtemp(prefix="iotune-load-", dir="/var/tmp"))
    subprocess.run(["git", "clone", "-q", str(TOP), str(clone / "repo")], check=True)
    # the commit the clone holds, read now: the checkout may move on while the run goes
    head = subprocess.run(
        ["git", "-C", str(clone / "repo"), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(f"ci_under_load: {head} cloned into {clone / 'repo'}", flush=True)
    load = [f"--cpu {args.cpu}"] * bool(args.cpu) + ["--io"] * args.io + ["--mem"] * args.mem
    load += ["--bursty"] * args.bursty
    pids = [start(cpu_loop) for _ in range(args.cpu)]
    if args.io:
        pids.append(start(io_writer, load_dir, False))
    if args.mem:
        pids.append(start(mem_pressure, load_dir, False))
    if args.bursty:
        pids.append(start(bursty, load_dir, clone / "repo" / ".venv"))
    t0 = time.monotonic()
    try:
        run = subprocess.run(
            ["bash", ".ci/run"],
            cwd=clone / "repo",
            env={**os.environ, "CI": "true"},
            stdin=subprocess.DEVNULL,
            check=False,
        )
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        for f in load_dir.iterdir():
            f.unlink()
        load_dir.rmdir()
        if not args.keep:
            subprocess.run(["rm", "-rf", str(clone)], check=False)
    wall = time.monotonic() - t0
    print(
        f"ci_under_load: {head} with {' '.join(load) or 'nothing'} beside it: "
        f"{'passed' if run.returncode == 0 else f'failed ({run.returncode})'} in {wall:.0f} s "
        f"({wall / 60:.1f} min)"
    )
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
