"""The swap rehearsal inside a process that looks like the training worker: a CUDA context,
GPU memory in use, and as much host memory resident as opt_nvme_1b's worker holds. Prints
the rehearsal's JSON (iotune.workers.aio_swap) with what was held beside it.

    python benchmarks/swap_in_process.py SWEEP_DIR PRESET TARGET ROUNDS [HOST_GIB] [GPU_GIB]

SWEEP_DIR is a finished sweep-aio run (its recommended aio block is used).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    sweep, preset, target, rounds = sys.argv[1:5]
    host_gib = float(sys.argv[5]) if len(sys.argv) > 5 else 10.0
    gpu_gib = float(sys.argv[6]) if len(sys.argv) > 6 else 9.0
    import torch

    from iotune.sweep import swap
    from iotune.workers.aio_swap import rehearse

    held = {}
    if torch.cuda.is_available():
        gpu = torch.empty(int(gpu_gib * 2**30), dtype=torch.uint8, device="cuda")
        gpu.fill_(1)
        torch.cuda.synchronize()
        held["gpu_bytes"] = gpu.numel()
    host = torch.empty(int(host_gib * 2**30), dtype=torch.uint8)
    host.fill_(1)  # resident, as the worker's model and buffers are
    held["host_bytes"] = host.numel()
    aio = json.loads((Path(sweep) / "result.json").read_text())["aio"]
    point, _ = swap.plan(preset, aio)
    point.update(target=target, rounds=int(rounds))
    # DeepSpeed on the GPU's accelerator, as in the training worker
    os.environ["DS_ACCELERATOR"] = "cuda" if torch.cuda.is_available() else "cpu"
    result = rehearse(point)
    print(json.dumps({"held": held, **result}))


if __name__ == "__main__":
    main()
