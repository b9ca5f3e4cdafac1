"""A user's Hugging Face Trainer script: TrainingArguments(deepspeed=ds_config.json) with a
config full of "auto", the Trainer's own loop, random tokens. iotune knows nothing of it
beyond its command line.

usage: python trainer_script.py MODEL_DIR DS_CONFIG STEPS SEQ_LEN MICRO_BATCH GA
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
    os.environ.setdefault(k, v)
os.environ.setdefault("MASTER_PORT", "29541")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments  # noqa: E402


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, seq: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    model_dir, ds, steps, seq, micro, ga = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(ds)), "trainer-out"),
        deepspeed=ds,
        max_steps=steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=ga,
        gradient_checkpointing=True,
        warmup_steps=1,  # DeepSpeed refuses a WarmupLR of 0 steps (from 0.19.6)
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
    )
    cfg = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(cfg)
    data = Tokens(steps * micro * ga, seq, cfg.vocab_size)
    Trainer(model=model, args=args, train_dataset=data).train()


if __name__ == "__main__":
    main()
