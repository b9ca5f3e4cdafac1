"""A user's script under accelerate launch with its DeepSpeed plugin.
usage: accelerate launch --use_deepspeed --deepspeed_config_file DS accel_script.py MODEL STEPS SEQ"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch
from accelerate import Accelerator
from accelerate.utils import DummyOptim
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    model_dir, steps, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    acc = Accelerator()
    cfg = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(cfg)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = DummyOptim(model.parameters())
    model, opt = acc.prepare(model, opt)
    mb = acc.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"]
    for step in range(steps):
        ids = torch.randint(0, cfg.vocab_size, (mb, seq))
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        print(f"step {step + 1} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
