"""Two measurements of `iotune sweep-aio`, side by side in one run on one target:

1. the best DeepSpeed async-I/O bandwidth against fio's best over the same grid, with fio
   keeping as many requests in flight as each AIO point (one job per AIO thread at the
   point's queue depth), read and write;
2. the adaptive strategy against the full grid, over several adaptive runs (each one a
   fresh draw of the measurement noise): points measured and the ratio of their bests.

    sudo .venv/bin/python benchmarks/sweep_aio.py [--ram-mib 3072] [--target DIR]
                                                 [--io-size 512M] [--seeds 3] [--keep DIR]
                                                 [--block-size 256K,1M,4M]
                                                 [--queue-depth 4,16,64] [--threads 1,2]

With --ram-mib (the default) the target is an ext4 volume on a loop device with direct I/O
over a file in /dev/shm: RAM behind the whole block layer, so what differs between AIO and
fio is software, and the run-to-run swing of a virtual disk is gone. --target DIR measures a
directory on a real drive instead.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_SCRIPT = Path(sys.executable).parent / "iotune"
# the virtualenv's command, or the package on PYTHONPATH where iotune is not installed
IOTUNE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "iotune"]
FIXED = ["--single-submit", "false", "--overlap-events", "false,true"]
GIB = 2**30


def sweep(
    target: Path, out: Path, strategy: str, io_size: str, fio: bool, space: list[str]
) -> dict[str, Any]:
    argv = [
        *IOTUNE,
        "--json",
        "sweep-aio",
        "--target",
        str(target),
        *space,
        "--io-size",
        io_size,
        "--repeats",
        "2",
        "--strategy",
        strategy,
        "--out",
        str(out),
        "--fio" if fio else "--no-fio",
    ]
    p = subprocess.run(argv, capture_output=True, text=True, check=True)
    return dict(json.loads(p.stdout))


def run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


@contextmanager
def ram_volume(mib: int) -> Iterator[Path]:
    """ext4 on a direct-I/O loop device over a /dev/shm file, mounted; removed after."""
    work = Path(tempfile.mkdtemp(prefix="iotune-bench-ram-"))
    fd, name = tempfile.mkstemp(dir="/dev/shm", prefix="iotune-bench-", suffix=".img")
    os.close(fd)
    img = Path(name)
    run("truncate", "-s", f"{mib}M", str(img))
    dev = run("losetup", "--direct-io=on", "--show", "-f", str(img))
    try:
        run("mkfs.ext4", "-q", "-F", dev)
        run("mount", dev, str(work))
        try:
            yield work
        finally:
            run("umount", str(work))
    finally:
        run("losetup", "-d", dev)
        img.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)


@contextmanager
def directory(path: str | None) -> Iterator[Path]:
    made = path is None
    target = Path(path or tempfile.mkdtemp(dir="/var/tmp", prefix="iotune-bench-"))
    try:
        yield target
    finally:
        if made:
            shutil.rmtree(target, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", help="a directory on a real drive instead of the RAM volume")
    ap.add_argument("--ram-mib", type=int, default=3072)
    ap.add_argument("--io-size", default="512M")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--block-size", default="256K,1M,4M")
    ap.add_argument("--queue-depth", default="4,16,64")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--keep", help="keep the sweeps' records in this directory")
    args = ap.parse_args()
    space = ["--block-size", args.block_size, "--queue-depth", args.queue_depth]
    space += ["--threads", args.threads, *FIXED]
    if args.keep:
        work = Path(args.keep)
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="iotune-bench-runs-"))
    place = directory(args.target) if args.target else ram_volume(args.ram_mib)
    with place as target:
        grid = sweep(target, work / "grid", "grid", args.io_size, fio=True, space=space)
        adaptive = [
            sweep(target, work / f"adaptive-{i}", "adaptive", args.io_size, fio=False, space=space)
            for i in range(args.seeds)
        ]
    where = args.target or f"ext4 on a direct-I/O loop device over {args.ram_mib} MiB of /dev/shm"
    print(f"target: {where} (io-size {args.io_size}, space: {' '.join(space)})")
    print("\n1. best AIO against fio's best over the grid (fio: one job per AIO thread)")
    for op, f in grid["fio_best"].items():
        r = grid["best"][op]
        print(
            f"   {op:<5}: AIO {r['bw_bytes_s'] / GIB:6.2f} GiB/s (bs {r['block_size'] // 1024}K "
            f"qd {r['queue_depth']} x {r['threads']} thread(s), median of {r['measurements']}) = "
            f"{f['aio_pct']:5.1f}% of fio's {f['bw_bytes_s'] / GIB:.2f} GiB/s (bs "
            f"{f['block_size'] // 1024}K qd {f['queue_depth']} x {f['jobs']} job(s)); at its own "
            f"settings fio did {r['fio_bw_bytes_s'] / GIB:.2f} GiB/s ({r['pct_of_fio']:.1f}%)"
        )
    print(f"\n2. adaptive ({args.seeds} runs) against the full grid")
    pts = [a["points"] / grid["points"] for a in adaptive]
    print(
        f"   points measured: adaptive {[a['points'] for a in adaptive]}, grid {grid['points']} "
        f"({min(pts):.0%} to {max(pts):.0%})"
    )
    for op in ("read", "write"):
        g = grid["best"][op]["bw_bytes_s"]
        ratios = [a["best"][op]["bw_bytes_s"] / g for a in adaptive]
        print(
            f"   best {op:<5}: grid {g / GIB:.2f} GiB/s; adaptive/grid "
            + ", ".join(f"{x:.3f}" for x in ratios)
            + f" (median {statistics.median(ratios):.3f}, worst {min(ratios):.3f})"
        )
    print(f"\nrecords: {work}")


if __name__ == "__main__":
    main()
