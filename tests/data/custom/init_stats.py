"""Build a model from its config.json inside DeepSpeed's zero.Init on the CPU (one rank,
gloo), with the training worker's own code, and print each parameter's partition: name,
dimensions, standard deviation, largest magnitude (JSON lines). Usage: init_stats.py DIR"""

import json
import os
import sys
from pathlib import Path

import deepspeed
import torch

from iotune.workers.model_build import build_partitioned, model_config


def main() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("LOCAL_RANK", "0")
    deepspeed.init_distributed(dist_backend="gloo")
    mcfg, model_class = model_config(json.loads((Path(sys.argv[1]) / "config.json").read_text()))
    # leave NaN where the allocator will hand out the parameters' memory
    garbage = torch.full((64 << 20,), float("nan"))
    del garbage
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    model = build_partitioned(torch, deepspeed, mcfg, model_class, ds)
    for name, p in model.named_parameters():
        t = p.ds_tensor.float()
        print(
            json.dumps(
                {
                    "name": name,
                    "dim": len(p.ds_shape),
                    "std": t.std().item(),
                    "max": t.abs().max().item(),
                }
            )
        )


if __name__ == "__main__":
    main()
