"""The tracer's cost on the training step: traced against untraced runs, pair by pair.

Reads the runs `benchmarks/gpu_trace_libbpf.sh` wrote (``pPART_I_trace.json`` and
``pPART_I_run.json``: `iotune --json trace --run PRESET` and `iotune --json run PRESET`,
taking turns) and prints, for each pair, the median steady step of each and their ratio,
then the median of the pair ratios and the pooled steady steps of each kind. For each traced
run it also prints what tracing cost in CPU time: its BPF programs by the kernel's clock
(``bpf_time``, where the statistics were on) and the tracing process's own CPU
(``tracer_cpu_s``), against the run's init and steps. Were all of it on the step's critical
path, the step could be no longer than that share.

    python benchmarks/step_pairs.py DIR [--part 5]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any


def steady(doc: dict[str, Any]) -> tuple[float, float, int]:
    """(median steady step s, median optimizer s, steady steps) from a run's table."""
    (row,) = [r for r in doc["table"] if r["case"].startswith("steady step")]
    m = re.search(r"median of (\d+)", row["case"])
    return float(row["step_s"]), float(row["optimizer_s"]), int(m.group(1)) if m else 1


def step_times(doc: dict[str, Any]) -> list[float]:
    """Every step's time, the first included, where the run recorded them."""
    return [
        float(e["step_s"])
        for e in doc.get("events", [])
        if e.get("event") == "step" and "step_s" in e
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--part", default="5")
    args = ap.parse_args()
    pairs: dict[int, dict[str, dict[str, Any]]] = {}
    for f in sorted(args.dir.glob(f"p{args.part}_*_*.json")):
        m = re.fullmatch(rf"p{args.part}_(\d+)_(trace|run)\.json", f.name)
        text = f.read_text()
        if m and text.strip():
            pairs.setdefault(int(m.group(1)), {})[m.group(2)] = json.loads(text)
    ratios = []
    pooled: dict[str, list[float]] = {"trace": [], "run": []}
    print(f"{'pair':>4} {'traced s':>9} {'untraced s':>10} {'ratio':>7}  optimizer traced/untraced")
    for i, pair in sorted(pairs.items()):
        for kind, doc in pair.items():
            pooled[kind] += step_times(doc)[1:]  # the steady steps: after the first
        if set(pair) != {"trace", "run"}:
            continue
        (t, to, n), (u, uo, _) = steady(pair["trace"]), steady(pair["run"])
        ratios.append(t / u)
        print(f"{i:4d} {t:9.3f} {u:10.3f} {t / u:7.3f}  {to:.3f} / {uo:.3f} (median of {n})")
    if ratios:
        print(f"median of {len(ratios)} pair ratios: {statistics.median(ratios):.4f}")
    for i, pair in sorted(pairs.items()):
        if "trace" not in pair or pair["trace"].get("tracer_cpu_s") is None:
            continue
        doc = pair["trace"]
        busy = doc["init_s"] + sum(step_times(doc))
        bpf_s = (doc.get("bpf_time") or {}).get("run_time_ns", 0) / 1e9
        runs = (doc.get("bpf_time") or {}).get("run_cnt", 0)
        cpu = doc["tracer_cpu_s"]
        print(
            f"traced run {i}: BPF programs {bpf_s:.3f} s ({runs:,} runs), iotune's process "
            f"{cpu:.3f} s of CPU, over {busy:.1f} s of init and steps: "
            f"{100 * (bpf_s + cpu) / busy:.2f}% at most"
        )
    for kind, xs in pooled.items():
        if xs:
            print(
                f"{kind}: {len(xs)} steady steps, median {statistics.median(xs):.3f} s, "
                f"range {min(xs):.3f}..{max(xs):.3f}"
            )


if __name__ == "__main__":
    main()
