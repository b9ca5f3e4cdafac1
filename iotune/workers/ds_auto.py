"""Worker: fill a Hugging Face Trainer DeepSpeed config's ``"auto"`` values as the Trainer
does, with transformers' own integration (``transformers.integrations.deepspeed.
HfTrainerDeepSpeedConfig``: ``trainer_config_process`` from the training arguments,
``trainer_config_finalize`` from the model's hidden size and the number of steps).

    python -m iotune.workers.ds_auto REQUEST.json

REQUEST: {"config": {...}, "model": "DIR", "args": {TrainingArguments fields}, "steps": N}.
The arguments are the Trainer's defaults where iotune has nothing of its own (learning rate
5e-5, Adam betas 0.9/0.999, epsilon 1e-8, weight decay 0, max_grad_norm 1.0, no warm-up),
and iotune's micro-batch, accumulation, ranks and dtype. Prints one JSON line: the filled
config, or the error transformers raised.
"""

from __future__ import annotations

import importlib
import os
from types import SimpleNamespace
from typing import Any

from iotune.workers import report_json_request

#: TrainingArguments' own defaults for the fields its DeepSpeed integration reads
TRAINER_DEFAULTS: dict[str, Any] = {
    "learning_rate": 5e-5,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-8,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "save_on_each_node": False,
    "fp16": False,
    "fp16_full_eval": False,
    "bf16_full_eval": False,
    "warmup_steps": 0,
}


def fill(req: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from transformers import AutoConfig

    # untyped: transformers' integration, called as the Trainer calls it
    integration: Any = importlib.import_module("transformers.integrations.deepspeed")

    args = SimpleNamespace(**{**TRAINER_DEFAULTS, **req["args"]})
    args.get_warmup_steps = lambda n: int(args.warmup_steps)
    model = SimpleNamespace(config=AutoConfig.from_pretrained(req["model"]))
    try:
        hf = integration.HfTrainerDeepSpeedConfig(req["config"])
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, model, int(req["steps"]))
    except (ValueError, KeyError, TypeError) as exc:
        return {"error": str(exc).strip().splitlines()[0]}
    finally:
        integration.unset_hf_deepspeed_config()
    return {"config": hf.config}


if __name__ == "__main__":
    report_json_request(fill)
