"""Build a model from its config.json inside DeepSpeed's zero.Init on the CPU (one rank,
gloo), the way iotune's training worker does, and print each parameter's partition: name,
dimensions, standard deviation, largest magnitude (JSON lines). Usage: init_stats.py DIR"""

import json
import os
import sys
from pathlib import Path

import deepspeed
import torch
from transformers import CONFIG_MAPPING, AutoModelForCausalLM

from iotune.workers.train import _init_in_constructors


def main() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1")
    os.environ.setdefault("LOCAL_RANK", "0")
    deepspeed.init_distributed(dist_backend="gloo")
    cfg = json.loads((Path(sys.argv[1]) / "config.json").read_text())
    mcfg = CONFIG_MAPPING[cfg.pop("model_type")].from_dict(cfg)
    model_class = AutoModelForCausalLM._model_mapping[type(mcfg)]
    # leave NaN where the allocator will hand out the parameters' memory
    garbage = torch.full((64 << 20,), float("nan"))
    del garbage
    ds = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    with _init_in_constructors(torch, 0.02), deepspeed.zero.Init(config_dict_or_path=ds):
        model = model_class(mcfg)
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
