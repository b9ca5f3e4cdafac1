"""Wall time of `iotune sweep-aio` per point: this checkout against an earlier revision of
iotune, the same grid on the same target, run in turn (A B A B ...) in one run.

    sudo .venv/bin/python benchmarks/sweep_speed.py [--baseline b4b2b14] [--rounds 3]
                                                   [--target /var/tmp] [--io-size 64M]

The baseline is checked out in a temporary git worktree and run with this checkout's
virtualenv (PYTHONPATH points at it), so only iotune's code differs. Prints each round's
seconds per point and the median ratio new/baseline.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRID = [
    "--block-size",
    "256K,1M",
    "--queue-depth",
    "8,32",
    "--threads",
    "1",
    "--single-submit",
    "false",
    "--overlap-events",
    "false,true",
    "--ops",
    "read,write",
    "--repeats",
    "2",
    "--strategy",
    "grid",
    "--no-fio",
]


def sweep(code: Path, target: str, io_size: str, out: Path) -> tuple[float, int]:
    """Seconds per point and points of one grid sweep run with iotune from *code*."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    argv = [sys.executable, "-m", "iotune", "--json", "sweep-aio", "--target", target]
    argv += [*GRID, "--io-size", io_size, "--out", str(out)]
    t0 = time.monotonic()
    subprocess.run(argv, env=env, cwd=code, capture_output=True, check=True)
    points = len((out / "points.jsonl").read_text().splitlines())
    return (time.monotonic() - t0) / points, points


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default="b4b2b14")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--target", default="/var/tmp")  # noqa: S108 (a drive, not tmpfs)
    ap.add_argument("--io-size", default="64M")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="iotune-bench-speed-"))
    base = work / "baseline"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.baseline],
        capture_output=True,
        check=True,
    )
    try:
        rows = []
        for i in range(args.rounds):
            old, points = sweep(base, args.target, args.io_size, work / f"old-{i}")
            new, _ = sweep(ROOT, args.target, args.io_size, work / f"new-{i}")
            rows.append((old, new))
            print(f"round {i + 1}: baseline {old:6.2f} s/point, this checkout {new:6.2f} s/point")
        ratios = [n / o for o, n in rows]
        print(
            f"seconds per point, this checkout / {args.baseline}: median "
            f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}) "
            f"over {args.rounds} rounds of {points} points"
        )
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
