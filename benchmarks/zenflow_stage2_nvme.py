"""Does ZenFlow configured with NVMe at ZeRO stage 1/2 touch the drive? iotune refuses that
configuration (DeepSpeed keeps "nvme" optimizer state in RAM below stage 3), so this writes the
training worker's spec for it by hand, to be run under `iotune trace`:

    python3 benchmarks/zenflow_stage2_nvme.py RUN_DIR SWAP_DIR [STEPS]
    python3 -m iotune trace --devices vda --out RUN_DIR/trace -- \\
        python3 -m iotune.workers.train RUN_DIR/spec.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from iotune.model.dsconfig import ds_config
from iotune.model.presets import apply_sets, get_preset
from iotune.train.runner import worker_spec


def main() -> None:
    run_dir, swap = Path(sys.argv[1]), Path(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    run_dir.mkdir(parents=True, exist_ok=True)
    swap.mkdir(parents=True, exist_ok=True)
    p = apply_sets(get_preset("opt_ram_zenflow_1b"), {"ds.zero_optimization.stage": 2})
    cfg = ds_config(p)
    cfg["zero_optimization"]["offload_optimizer"] = {
        "device": "nvme",
        "nvme_path": str(swap),
        "pin_memory": True,
    }
    spec = worker_spec(apply_sets(p, {"steps": steps}), cfg, run_dir, [swap])
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")


if __name__ == "__main__":
    main()
