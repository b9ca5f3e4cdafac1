"""Two measurements of `iotune sweep-aio`, side by side in one run on one target:

1. the best DeepSpeed async-I/O bandwidth against fio's best over the same grid, with fio
   keeping as many requests in flight as each AIO point (one job per AIO thread at the
   point's queue depth), read and write;
2. the adaptive strategy against the full grid, over several adaptive runs (each one a
   fresh draw of the measurement noise): points measured and the ratio of their bests;
3. a confirmation: each winner of 1 and 2 measured again, in turn, round after round in one
   worker (A B C A B C ...), fio's best and fio at the AIO winner's own settings too. A best
   picked out of many noisy measurements is biased upward (the more candidates, the more):
   re-measured side by side, the winners compare on equal terms.

    sudo .venv/bin/python benchmarks/sweep_aio.py [--ram-mib 3072] [--target DIR]
                                                 [--io-size 512M] [--seeds 3] [--keep DIR]
                                                 [--block-size 256K,1M,4M]
                                                 [--queue-depth 4,16,64] [--threads 1,2]
                                                 [--confirm-rounds 5] [--reuse DIR]
                                                 [--grid-from DIR]

--reuse DIR takes the sweeps an earlier run kept with --keep DIR and only confirms.
--grid-from DIR takes only the grid of such a run (same space, same kind of target) and runs
the adaptive sweeps and the confirmation anew: the grid is the long part, and the
confirmation measures its winner again beside theirs.

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

from iotune import proc
from iotune.proc import worker_env
from iotune.sweep.fio import measure_ceiling
from iotune.units import parse_size

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


CFG = ("block_size", "queue_depth", "threads", "single_submit", "overlap_events")


def label(c: dict[str, Any]) -> str:
    oe = " oe" if c.get("overlap_events") else ""
    return f"{c['block_size'] // 1024}K qd {c['queue_depth']} x {c['threads']}{oe}"


def fio_points(grid: dict[str, Any], op: str) -> dict[str, tuple[int, int, int]]:
    """fio's best over the grid and fio at the AIO winner's settings (one entry where they
    are the same): label -> (block size, queue depth, jobs)."""
    fb, g = grid["fio_best"][op], grid["best"][op]
    out = {}
    for bs, qd, jobs in (
        (fb["block_size"], fb["queue_depth"], fb["jobs"]),
        (g["block_size"], g["queue_depth"], g["threads"]),
    ):
        out[fio_label(bs, qd, jobs)] = (bs, qd, jobs)
    return out


def confirm(
    target: Path, io_size: int, grid: dict[str, Any], adaptive: list[dict[str, Any]], rounds: int
) -> dict[str, dict[str, list[float]]]:
    """op -> candidate -> bandwidth per round: the grid's and each adaptive run's best AIO
    configuration, fio's best and fio at the grid winner's settings, in turn each round."""
    out: dict[str, dict[str, list[float]]] = {}
    with proc.JsonWorker([sys.executable, "-m", "iotune.workers.aio_point"], env=worker_env()) as w:
        for op in ("read", "write"):
            aio: dict[str, dict[str, Any]] = {}
            for res in [grid, *adaptive]:
                best = res["best"][op]
                aio.setdefault(label(best), {k: best[k] for k in CFG})
            fio = fio_points(grid, op)
            got: dict[str, list[float]] = {k: [] for k in [*aio, *fio]}
            for r in range(rounds):
                for name, cfg in aio.items():
                    point = {
                        **cfg,
                        "op": op,
                        "repeats": 2,
                        "target": str(target),
                        "io_size": io_size,
                    }
                    got[name].append(float(w.ask(point, timeout=600)["bw_bytes_s"]))
                for name, (bs, qd, jobs) in fio.items():
                    res = measure_ceiling(target, op, bs, qd, io_size, jobs=jobs)
                    got[name].append(float(res["bw_bytes_s"]))
                round_line(f"   confirm {op} round {r + 1}", got)
            out[op] = got
    return out


def round_line(prefix: str, got: dict[str, list[float]]) -> None:
    """One line on stderr: each candidate's latest measurement in GiB/s."""
    print(
        f"{prefix}: " + ", ".join(f"{k} {v[-1] / GIB:.2f}" for k, v in got.items()),
        file=sys.stderr,
        flush=True,
    )


def fio_label(bs: int, qd: int, jobs: int) -> str:
    return f"fio {bs // 1024}K qd {qd} x {jobs}"


def spread(xs: list[float]) -> str:
    return f"{min(xs):.3f}..{max(xs):.3f}"


def ratio(got: dict[str, list[float]], a: str, b: str) -> str:
    """Ratio of the medians of *a* and *b*, and the range of the per-round ratios."""
    rs = [x / y for x, y in zip(got[a], got[b], strict=True)]
    m = statistics.median(got[a]) / statistics.median(got[b])
    return f"{m:.3f} (per round {spread(rs)})"


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
    ap.add_argument("--reuse", help="the records of an earlier --keep: confirm only")
    ap.add_argument("--grid-from", help="the grid of an earlier --keep: adaptive and confirm")
    ap.add_argument("--confirm-rounds", type=int, default=5)
    args = ap.parse_args()
    if args.grid_from and not (Path(args.grid_from) / "grid" / "result.json").is_file():
        ap.error(f"--grid-from {args.grid_from}: no grid/result.json (a --keep DIR of a run)")
    space = ["--block-size", args.block_size, "--queue-depth", args.queue_depth]
    space += ["--threads", args.threads, *FIXED]
    if args.keep or args.reuse:
        work = Path(args.keep or args.reuse)
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="iotune-bench-runs-"))
    place = directory(args.target) if args.target else ram_volume(args.ram_mib)
    with place as target:
        if args.reuse:
            grid = json.loads((work / "grid" / "result.json").read_text())
            adaptive = [
                json.loads(p.read_text()) for p in sorted(work.glob("adaptive-*/result.json"))
            ]
        else:
            if args.grid_from:
                # kept beside the new runs, so that --reuse of this --keep finds it
                if Path(args.grid_from).resolve() != work.resolve():
                    shutil.copytree(
                        Path(args.grid_from) / "grid", work / "grid", dirs_exist_ok=True
                    )
                grid = json.loads((work / "grid" / "result.json").read_text())
            else:
                grid = sweep(target, work / "grid", "grid", args.io_size, fio=True, space=space)
            adaptive = [
                sweep(
                    target, work / f"adaptive-{i}", "adaptive", args.io_size, fio=False, space=space
                )
                for i in range(args.seeds)
            ]
        confirmed = (
            confirm(target, parse_size(args.io_size), grid, adaptive, args.confirm_rounds)
            if args.confirm_rounds
            else {}
        )
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
    print(f"\n2. adaptive ({len(adaptive)} runs) against the full grid")
    if args.grid_from:
        print(
            f"   (the grid from {args.grid_from}, measured at another time: its values and "
            "these runs' are not side by side; 3 is)"
        )
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
    for op, got in confirmed.items():
        if op == "read":
            print(
                f"\n3. the winners measured again, in turn, {args.confirm_rounds} rounds "
                "(median GiB/s, and min..max)"
            )
        names = list(got)
        grid_name = label(grid["best"][op])
        fio_names = list(fio_points(grid, op))
        fio_best, fio_same = fio_names[0], fio_names[-1]
        for n in names:
            med = statistics.median(got[n])
            xs = [x / GIB for x in got[n]]
            print(f"   {op:<5} {n:<28} {med / GIB:6.2f} GiB/s  ({spread(xs)})")
        print(f"   {op:<5} AIO grid winner / {fio_best}: {ratio(got, grid_name, fio_best)}")
        if fio_same != fio_best:
            print(f"   {op:<5} AIO grid winner / {fio_same}: {ratio(got, grid_name, fio_same)}")
        for n in names:
            if not n.startswith("fio ") and n != grid_name:
                print(f"   {op:<5} adaptive winner {n} / grid winner: {ratio(got, n, grid_name)}")
        winners = [label(a["best"][op]) for a in adaptive]
        print(f"   {op:<5} adaptive runs' winners: {winners}; the grid's: {grid_name}")
    print(f"\nrecords: {work}")


if __name__ == "__main__":
    main()
