"""Does the size of the buffer an I/O lands in change what a RAM-backed target delivers?

On a loop device over /dev/shm every request is a memory copy done by the loop driver, so the
target's speed depends on where the copy goes. fio reads into block size x queue depth bytes
per job, reused request after request (1 MiB for 256 KiB x 4, which stays in the CPU's
caches); DeepSpeed's async I/O reads a whole tensor (here the 2 GiB of --io-size) into its
own pinned buffer, every byte of it a fresh cache line. This script measures, in turn, round
after round, at one block size, queue depth and thread count:

- ``aio whole``: one ``sync_pread``/``sync_pwrite`` of the whole --io-size buffer (what
  `iotune sweep-aio` and DeepSpeed's swapper do);
- ``aio slices N``: the same bytes moved N at a time (``file_offset``) through one pinned
  buffer of N bytes reused for every call: fio's footprint, with DeepSpeed's per-call cost
  (it opens the file and hands the work to its threads on every call);
- ``fio``: fio with as many jobs as threads at the same block size and queue depth;

and prints each one's median and the ratios to ``aio whole``. If the small buffer is faster
than the whole one, the gap between fio and AIO on this target is the copy's destination,
not software.

    sudo .venv/bin/python benchmarks/aio_footprint.py [--ram-mib 3072] [--io-size 2G]
        [--block-size 256K] [--queue-depth 4] [--threads 1] [--slices 1M,16M] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.sweep_aio import directory, ram_volume, round_line
from iotune.sweep.fio import measure_ceiling
from iotune.units import parse_size

GIB = 2**30


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", help="a directory on a real drive instead of the RAM volume")
    ap.add_argument("--ram-mib", type=int, default=3072)
    ap.add_argument("--io-size", default="2G")
    ap.add_argument("--block-size", default="256K")
    ap.add_argument("--queue-depth", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--slices", default="1M,16M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", default="read,write")
    args = ap.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    io_size, bs, qd, th = (
        parse_size(args.io_size),
        parse_size(args.block_size),
        args.queue_depth,
        args.threads,
    )
    slices = [parse_size(s) for s in args.slices.split(",") if s]
    for s in slices:
        if io_size % s or s % (bs * th):
            sys.exit(f"a slice ({s}) must divide --io-size and be a multiple of block x threads")
    op = AsyncIOBuilder().load(verbose=False)
    handle = op.aio_handle(bs, qd, False, True, th)
    empty = torch.empty(0, dtype=torch.uint8)
    whole = handle.new_cpu_locked_tensor(io_size, empty)
    whole.random_(0, 255)
    small = {s: handle.new_cpu_locked_tensor(s, empty) for s in slices}
    place = directory(args.target) if args.target else ram_volume(args.ram_mib)
    got: dict[str, dict[str, list[float]]] = {}
    with place as target:
        path = str(target / "iotune-footprint.dat")
        handle.sync_pwrite(whole, path)
        for opname in args.ops.split(","):
            rw = handle.sync_pread if opname == "read" else handle.sync_pwrite

            def at_once(rw: Any = rw) -> None:
                rw(whole, path)

            cand: dict[str, Callable[[], None]] = {"aio whole": at_once}
            for s in slices:

                def sliced(s: int = s, rw: Any = rw) -> None:
                    buf = small[s]
                    for off in range(0, io_size, s):
                        rw(buf, path, off)

                cand[f"aio slices {s // 2**20}M"] = sliced
            res: dict[str, list[float]] = {k: [] for k in [*cand, "fio"]}
            for fn in cand.values():  # warm-up, not counted
                fn()
            for r in range(args.rounds):
                for name, fn in cand.items():
                    res[name].append(io_size / timed(fn))
                f = measure_ceiling(target, opname, bs, qd, io_size, jobs=th)
                res["fio"].append(float(f["bw_bytes_s"]))
                round_line(f"{opname} round {r + 1}", res)
            got[opname] = res
        os.unlink(path)
    where = args.target or f"ext4 on a direct-I/O loop device over {args.ram_mib} MiB of /dev/shm"
    print(
        f"target: {where}; {bs // 1024} KiB blocks, queue depth {qd}, {th} thread(s) / "
        f"fio job(s), {args.rounds} rounds, io-size {args.io_size}"
    )
    print(f"{'':6}{'':22}{'median GiB/s':>13}  {'min..max':>13}  {'/ aio whole':>11}")
    for opname, res in got.items():
        base = statistics.median(res["aio whole"])
        for name, xs in res.items():
            med = statistics.median(xs)
            print(
                f"{opname:<6}{name:<22}{med / GIB:13.2f}  "
                f"{min(xs) / GIB:6.2f}..{max(xs) / GIB:<6.2f}  {med / base:11.3f}"
            )
    handle.free_cpu_locked_tensor(whole)
    for t in small.values():
        handle.free_cpu_locked_tensor(t)


if __name__ == "__main__":
    main()
