"""A user's script under `accelerate launch --config_file acc.yaml`, DeepSpeed set up in
accelerate's YAML (no DeepSpeed JSON): a DataLoader of random tokens, whose batch size
accelerate puts in DeepSpeed's "auto" micro-batch, and torch's AdamW, for which accelerate
gives DeepSpeed its CPU Adam (the optimizer state is offloaded).
usage: accelerate launch --config_file ACC_YAML accel_script.py MODEL STEPS SEQ MICRO_BATCH"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import torch
from accelerate import Accelerator
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    model_dir, steps, seq, micro = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    acc = Accelerator()
    cfg = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(cfg)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (steps * micro, seq), generator=g)
    data = torch.utils.data.DataLoader(ids, batch_size=micro)
    model, opt, data = acc.prepare(model, opt, data)
    for step, batch in enumerate(data):
        loss = model(input_ids=batch, labels=batch).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        print(f"step {step + 1} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
