"""The drives planner against real drives: the seed study's 16B rows, measured on one Samsung
980 PRO 2 TB and on a RAID0 of three PCIe 4.0 drives, against what `iotune estimate --drives`
plans from the drive's datasheet profile (configs/drives.toml), DeepSpeed's published
derating and the study's own figures (--baseline study). Nothing is owned or measured here:
this is the planner's accuracy before purchase, as the study's drives bound it.

    python benchmarks/planner_accuracy.py [--drive PROFILE]

Prints, per strategy and drive count, the planned step, the study's measured step and the
error, and the worst error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent / "iotune"
SETS = ("--set", "model.num_hidden_layers=60")  # the study's N within 0.6%


def plan(strategy: str, drive: str) -> list[dict[str, object]]:
    args = ("--drive", drive, "--baseline", "study", "--drives", "1,3")
    p = subprocess.run(
        [str(BIN), "--json", "estimate", f"{strategy}_16b", *SETS, *args],
        capture_output=True,
        text=True,
        check=True,
    )
    plans: list[dict[str, object]] = json.loads(p.stdout)["drives"]["plans"]
    return plans


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drive", default="samsung-980-pro-2tb")
    a = ap.parse_args()
    worst = 0.0
    print(f"{'strategy':<18} {'drives':>6} {'planned s':>10} {'study s':>9} {'error':>8}")
    for strategy in ("opt_nvme", "params_opt_nvme"):
        for p in plan(strategy, a.drive):
            step, study = p["step_s"], p["study_step_s"]
            if not isinstance(step, float) or not isinstance(study, float):
                continue
            err = (step - study) / study
            worst = max(worst, abs(err))
            print(f"{strategy:<18} {p['drives']:>6} {step:>10.2f} {study:>9.2f} {err:>+8.1%}")
    print(f"worst |error|: {worst:.1%} ({a.drive}'s datasheet, the study's own figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
