"""A save's copy of the swap files, by each copy, against the raw O_DIRECT copy, side by side.

A disk's rate moves over a day, so a copy and its ceiling measured hours apart say little of
each other. Here they take turns, in one run, between the same two folders: a swap folder as
DeepSpeed leaves it for a preset (iotune.sweep.copysweep.swap_files: opt_nvme_1b's 33 files,
14.8 GB), written O_DIRECT, and a checkpoint folder. Each round, the order turned each time:

- ``ceiling``: the raw O_DIRECT copy through the aio op (iotune.workers.copyrate.ceiling: each
  chunk's read and write in flight at once, the best of its settings), then fsync;
- ``aio``: iotune's copy (iotune.workers.swapcopy.copy_tree), durable when it returns;
- ``deepspeed``: ``shutil.copytree`` as DeepSpeed's save calls it, then every file and folder
  fsynced; its blocked time (what DeepSpeed's save waits for) and its durable time;
- ``reflink``: each file cloned, where the checkpoint folder's file system clones and holds
  the swap folder (``--copies`` names it).

The page cache is dropped before each copy. Printed: each round's seconds and GiB/s, the
ratios, and their medians.

    sudo python benchmarks/swapcopy_pairs.py --src OFFLOAD_DIR --dst CHECKPOINT_DIR
        [--preset opt_nvme_1b] [--rounds 3] [--copies aio,deepspeed[,reflink]]
        [--aio '{"block_size": 1048576, "queue_depth": 32, "intra_op_parallelism": 4}']
        [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from iotune.proc import worker_env
from iotune.sweep.copysweep import swap_files
from iotune.workers.copy_point import same_ends
from iotune.workers.copyrate import ceiling, drop_caches, make_folder
from iotune.workers.swapcopy import AioSettings, copy_tree

GIB = 2**30


def one(copy: str, src: Path, dst: Path, settings: AioSettings) -> dict[str, Any]:
    target = dst / f"copy-{copy}"
    drop_caches()
    if copy == "ceiling":
        rec = ceiling(src, target)
        return {
            "copy": copy,
            "seconds": rec["seconds"],
            "durable_s": rec["seconds"],
            "bytes": rec["bytes"],
            "best": {k: rec[k] for k in ("block_size", "queue_depth", "threads")},
            "rows": rec["rows"],
        }
    r = copy_tree(src, target, copy, settings=settings)
    ok = same_ends(src, target)
    shutil.rmtree(target)
    return {
        "copy": copy,
        "seconds": r.seconds,
        "blocked_s": r.seconds - r.durable_s,
        "durable_s": r.seconds,
        "bytes": r.bytes,
        "files": r.files,
        "same": ok,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, type=Path, help="a folder on the offload volume")
    ap.add_argument("--dst", required=True, type=Path, help="a folder on the checkpoint volume")
    ap.add_argument("--preset", default="opt_nvme_1b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--copies", default="aio,deepspeed")
    ap.add_argument("--aio", default="{}", help="the aio copy's settings (JSON: AioSettings)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    os.environ.update(worker_env())  # the ops iotune built (its workers' cache), not a rebuild
    settings = AioSettings(**json.loads(a.aio)).checked()
    swap = a.src / "swap-rank0"
    t0 = time.perf_counter()
    n = make_folder(swap, swap_files(a.preset), settings)
    print(
        f"{a.preset}'s swap folder: {len(list(swap.iterdir()))} files, {n:,} bytes "
        f"({n / GIB:.2f} GiB), written in {time.perf_counter() - t0:.1f} s; aio copy {settings}",
        flush=True,
    )
    kinds = ["ceiling", *a.copies.split(",")]
    rounds: list[list[dict[str, Any]]] = []
    try:
        for i in range(a.rounds):
            order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]
            recs = [one(k, swap, a.dst, settings) for k in order]
            rounds.append(recs)
            by = {r["copy"]: r for r in recs}
            line = ", ".join(
                f"{k} {by[k]['durable_s']:.2f} s ({n / by[k]['durable_s'] / GIB:.2f} GiB/s"
                + (f", blocked {by[k]['blocked_s']:.2f} s" if "blocked_s" in by[k] else "")
                + ")"
                for k in order
            )
            print(f"round {i + 1}: {line}", flush=True)
            if a.out:
                a.out.write_text(
                    json.dumps({"bytes": n, "preset": a.preset, "rounds": rounds}, indent=1)
                )
    finally:
        shutil.rmtree(swap, ignore_errors=True)
    med = {
        k: statistics.median(r["durable_s"] for rs in rounds for r in rs if r["copy"] == k)
        for k in kinds
    }
    print("median durable s: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))

    def ratio(a_: str, b_: str) -> float:
        return float(
            statistics.median(
                next(r["durable_s"] for r in rs if r["copy"] == b_)
                / next(r["durable_s"] for r in rs if r["copy"] == a_)
                for rs in rounds
            )
        )

    if "aio" in kinds:
        print(
            f"aio copy's rate / ceiling's: median {ratio('aio', 'ceiling'):.3f} "
            "(the goal: at least 0.80)"
        )
    if "aio" in kinds and "deepspeed" in kinds:
        print(
            f"deepspeed's durable copy / aio's: median {ratio('aio', 'deepspeed'):.2f}x "
            "(the goal: at least 2x)"
        )
        blocked = statistics.median(
            next(r["blocked_s"] for r in rs if r["copy"] == "deepspeed")
            / next(r["durable_s"] for r in rs if r["copy"] == "aio")
            for rs in rounds
        )
        print(f"deepspeed's blocked time (copytree alone) / aio's: median {blocked:.2f}x")
    if "reflink" in kinds:
        print(f"reflink: median {med['reflink']:.3f} s for {n / GIB:.2f} GiB")
    bad = [r for rs in rounds for r in rs if r.get("same") is False]
    if bad:
        print(f"{len(bad)} copies differ from the source", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
