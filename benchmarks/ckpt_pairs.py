"""The tuned fast writer against the volume's own write ceiling, save by save, side by side.

A disk's write rate moves over a day (the H100 machine's virtio disk gave ceilings of 2.38 to
3.01 GiB/s the same day), so a save and a ceiling measured hours apart say little of each
other. Here they take turns on one volume, in one run: for each round, the volume's ceiling
(sweep-checkpoint's own: O_DIRECT writes of the state's size through the aio op, the best of
its settings, then fsync), the fast writer with the given knobs, and torch.save of the same
state, each in a worker process as sweep-checkpoint runs them, the order turned each round.
Printed: each round's figures and ratios, then the median of the ratios.

    sudo python benchmarks/ckpt_pairs.py --target DIR [--params 500M] [--rounds 5]
        [--knobs '{"io_buffer_size": 1073741824, ...}']
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from iotune.sweep.ckpt import save_in_worker
from iotune.sweep.threads import parse_params

#: the best the H100's sweep found (benchmarks/results/gpu-ckpt-sweep-h100-rounds/)
BEST = {
    "io_buffer_size": 2**30,
    "io_buffer_double": True,
    "block_size": 8 * 2**20,
    "queue_depth": 8,
    "threads": 1,
    "single_submit": False,
    "overlap_events": True,
    "crc32": False,
    "record_copy": False,
}
GIB = 2**30


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--params", default="500M")
    ap.add_argument("--sub-group", default="1e9")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--knobs", default=json.dumps(BEST), help="the fast writer's knobs (JSON)")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", help="a JSON file for every record")
    a = ap.parse_args()
    n = parse_params(a.params)
    base: dict[str, Any] = {
        "params": n,
        "sub_group": parse_params(a.sub_group),
        "target": str(Path(a.target).resolve()),
    }
    knobs = {**BEST, **json.loads(a.knobs)}
    kinds: dict[str, dict[str, Any]] = {
        "ceiling": {**base, "writer": "ceiling"},
        "fast": {**base, "writer": "fast", **knobs},
        "torch": {**base, "writer": "torch"},
    }
    records: list[dict[str, Any]] = []
    share, versus_torch = [], []
    print(f"state: {12 * n / GIB:.2f} GiB on {base['target']}; knobs {knobs}")
    print(f"{'round':>5}  {'ceiling GiB/s':>13}  {'fast s':>7}  {'fast GiB/s':>10}  "
          f"{'of ceiling':>10}  {'torch s':>7}  {'torch/fast':>10}")  # fmt: skip
    for i in range(a.rounds):
        order = ["ceiling", "fast", "torch"] if i % 2 == 0 else ["torch", "fast", "ceiling"]
        got = {}
        for kind in order:
            rec = {"round": i, "kind": kind, **save_in_worker(kinds[kind], a.timeout)}
            records.append(rec)
            got[kind] = rec
        if any(r.get("status") != "ok" for r in got.values()):
            print(f"{i:>5}  failed: " + "; ".join(f"{k}: {r.get('error')}" for k, r in got.items()))
            continue
        ceil = float(got["ceiling"]["bw_bytes_s"])
        fast_s = float(got["fast"]["durable_s"])
        rate = float(got["fast"]["bytes"]) / fast_s
        torch_s = float(got["torch"]["durable_s"])
        share.append(rate / ceil)
        versus_torch.append(torch_s / fast_s)
        print(f"{i:>5}  {ceil / GIB:>13.2f}  {fast_s:>7.2f}  {rate / GIB:>10.2f}  "
              f"{100 * rate / ceil:>9.0f}%  {torch_s:>7.2f}  {torch_s / fast_s:>9.2f}x")  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps(records, indent=1) + "\n")
    if not share:
        print("no round completed")
        return 1
    print(
        f"median over {len(share)} rounds: fast writer at {100 * statistics.median(share):.0f}% "
        f"of the ceiling (range {100 * min(share):.0f}..{100 * max(share):.0f}%), durable "
        f"{statistics.median(versus_torch):.2f}x sooner than torch.save"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
