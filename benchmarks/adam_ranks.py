"""CPU Adam with R ranks at once: measured against what the planner predicts, in one run.

`iotune sweep-threads --ranks 1,R,...` times DeepSpeedCPUAdam with R processes stepping at
once, each on its share of the parameters at the node's cores // R threads, every step started
together; and one rank alone at each of those thread counts. The planner, without such a
sweep, predicts R ranks from one rank's figure (iotune.plan.cpus.fit_adam: the rank's
threads, and the node's memory bound from --cpu). Printed for each R: the measured seconds a
billion parameters a rank, the planner's, their ratio, and the ranks' contention (R ranks at
once against one rank alone at the same threads), and the same fit from one rank timed alone at
the threads each rank gets (PRED(1@T)), each the median of --rounds whole sweeps
taken one after the other (a shared host's memory bandwidth moves from one minute to the
next: each round's ratio is of figures measured within the round).

    sudo python benchmarks/adam_ranks.py --cpu cores=2,memory=460.8GB/s [--params 200M]
        [--ranks 1,2] [--repeats 5] [--rounds 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from iotune.plan.cpus import STUDY_CPU, adam_bytes, fit_adam, load_cpus, parse_cpu
from iotune.plan.measured import AdamRate, study_adam


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", required=True, help="the host's CPUs, as estimate --cpu takes them")
    ap.add_argument("--params", default="200M")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--repeats", default="5")
    ap.add_argument("--rounds", default="3")
    ap.add_argument("--out", default="results/adam-ranks")
    a = ap.parse_args()
    cpu = parse_cpu(a.cpu)
    ranks = [int(r) for r in a.ranks.split(",")]
    cores = cpu.node_cores
    threads = sorted({max(1, cores // r) for r in ranks})
    argv = [
        sys.executable,
        "-m",
        "iotune",
        "--json",
        "sweep-threads",
        "--params",
        a.params,
        "--ranks",
        a.ranks,
    ]
    argv += ["--threads", ",".join(map(str, threads)), "--repeats", a.repeats, "--out", a.out]
    ap_rounds = int(a.rounds)
    ref = study_adam()
    k = adam_bytes(ref, load_cpus()[STUDY_CPU]) if ref is not None else 0.0
    per: dict[int, list[tuple[float, float, float, float]]] = {r: [] for r in ranks}
    triads = []
    for i in range(ap_rounds):
        out = f"{a.out}/round{i}"
        done = subprocess.run([*argv[:-1], out], check=True, capture_output=True, text=True)
        doc = json.loads(done.stdout)
        ok: list[dict[str, Any]] = [r for r in doc["rows"] if r["status"] == "ok"]

        def spp(r: int, t: int, ok: list[dict[str, Any]] = ok) -> float:
            row = next(x for x in ok if x["ranks"] == r and x["threads"] == t)
            return float(row["step_ms_median"]) / 1000 / int(row["params"])

        alone = AdamRate(spp(1, max(threads)), max(threads), int(doc["params"]), out)
        for r in ranks:
            t = max(1, cores // r)
            measured = spp(r, t)
            predicted = fit_adam(alone, cpu, r, k).seconds_per_param
            # the same fit from one rank timed alone at the threads each rank gets
            at_t = AdamRate(spp(1, t), t, int(doc["params"]), out)
            pred_t = fit_adam(at_t, cpu, r, k).seconds_per_param
            per[r].append((measured, predicted, measured / spp(1, t), pred_t))
        mem = (doc.get("memory") or {}).get("best")
        if mem:
            triads.append(mem["triad_bytes_s"])
        line = ", ".join(
            f"{r} rank(s): {per[r][-1][0] * 1e9:.3f} s/1B, predicted {per[r][-1][1] * 1e9:.3f}"
            for r in ranks
        )
        print(
            f"round {i + 1}: {line}"
            + (f"; triad {mem['triad_bytes_s'] / 1e9:.1f} GB/s" if mem else "")
        )
    print(f"host: {cpu.describe()}; {os.cpu_count()} CPUs seen; {a.params} parameters")
    print(f"medians of {ap_rounds} round(s):")
    print("RANKS  THREADS  MEASURED s/1B  PREDICTED s/1B  PRED/MEAS  CONTENTION  PRED(1@T)/MEAS")
    for r in ranks:
        t = max(1, cores // r)
        m = statistics.median(x[0] for x in per[r])
        p = statistics.median(x[1] for x in per[r])
        ratio = statistics.median(x[1] / x[0] for x in per[r])
        cont = statistics.median(x[2] for x in per[r])
        from_t = statistics.median(x[3] / x[0] for x in per[r])
        print(
            f"{r:5d}  {t:7d}  {m * 1e9:13.3f}  {p * 1e9:14.3f}  {ratio:9.2f}  {cont:10.2f}"
            f"  {from_t:14.2f}"
        )
    if triads:
        print(
            f"memory: triad {min(triads) / 1e9:.1f} to {max(triads) / 1e9:.1f} GB/s over the rounds"
        )


if __name__ == "__main__":
    main()
