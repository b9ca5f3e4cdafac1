"""Two measurements of `iotune sweep-aio`, side by side in one run on one target:

1. the best DeepSpeed async-I/O bandwidth as a percentage of fio's ceiling (libaio,
   direct=1, same block size and queue depth), read and write;
2. the adaptive strategy against the full grid: points measured and the gap between
   their best results.

    sudo .venv/bin/python benchmarks/sweep_aio.py [--target DIR] [--io-size 64M]

The target defaults to a new directory under /var/tmp (the host's root drive).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

IOTUNE = str(Path(sys.executable).parent / "iotune")
SPACE = [
    "--block-size",
    "256K,1M,4M",
    "--queue-depth",
    "4,16,64",
    "--threads",
    "1,2",
    "--single-submit",
    "false",
    "--overlap-events",
    "false,true",
]


def sweep(
    target: Path, out: Path, strategy: str, ops: str, io_size: str, fio: bool
) -> dict[str, Any]:
    argv = [
        IOTUNE,
        "--json",
        "sweep-aio",
        "--target",
        str(target),
        *SPACE,
        "--ops",
        ops,
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target")
    ap.add_argument("--io-size", default="64M")
    args = ap.parse_args()
    made = args.target is None
    target = Path(args.target or tempfile.mkdtemp(dir="/var/tmp", prefix="iotune-bench-"))
    work = Path(tempfile.mkdtemp(prefix="iotune-bench-runs-"))
    try:
        adaptive = sweep(
            target, work / "adaptive", "adaptive", "read,write", args.io_size, fio=True
        )
        grid = sweep(target, work / "grid", "grid", "read,write", args.io_size, fio=False)
    finally:
        if made:
            shutil.rmtree(target, ignore_errors=True)
    print(f"target: {target} (io-size {args.io_size}, space: {' '.join(SPACE)})")
    print("\n1. best AIO bandwidth vs fio's ceiling at the same block size and queue depth")
    best_fio = {
        op: max((c["bw_bytes_s"] for c in adaptive["ceilings"] if c["op"] == op), default=0.0)
        for op in ("read", "write")
    }
    for op, r in adaptive["best"].items():
        print(
            f"   {op:<5}: AIO {r['bw_bytes_s'] / 2**30:6.2f} GiB/s = {r.get('pct_of_fio', 0):5.1f}% of fio at "
            f"bs {r['block_size'] // 1024}K qd {r['queue_depth']} ({r['fio_bw_bytes_s'] / 2**30:.2f} GiB/s); "
            f"{100 * r['bw_bytes_s'] / best_fio[op]:5.1f}% of the best fio point ({best_fio[op] / 2**30:.2f} GiB/s)"
        )
    print("\n2. adaptive vs full grid")
    print(
        f"   points measured: adaptive {adaptive['points']}, grid {grid['points']} "
        f"({adaptive['points'] / grid['points']:.0%})"
    )
    for op in ("read", "write"):
        a, g = adaptive["best"][op]["bw_bytes_s"], grid["best"][op]["bw_bytes_s"]
        print(
            f"   best {op:<5}: adaptive {a / 2**30:.2f} GiB/s, grid {g / 2**30:.2f} GiB/s, "
            f"adaptive/grid = {a / g:.3f}"
        )


if __name__ == "__main__":
    main()
