"""A user's script under Lightning's DeepSpeed strategy, as Lightning's docs write it: ZeRO-3
with the optimizer state offloaded to NVMe, set up by the strategy's own arguments (no
DeepSpeed JSON), DeepSpeed's CPU Adam from configure_optimizers, bf16-mixed precision and a
DataLoader of random tokens whose batch size the strategy puts in DeepSpeed's micro-batch.
Lightning's DeepSpeed strategy runs on CUDA GPUs only.
usage: lightning_script.py MODEL NVME_PATH STEPS SEQ MICRO_BATCH"""

import sys

import lightning as L
import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam
from lightning.pytorch.strategies import DeepSpeedStrategy
from transformers import AutoConfig, AutoModelForCausalLM


class CausalLM(L.LightningModule):
    def __init__(self, model_dir: str) -> None:
        super().__init__()
        self.model_dir = model_dir
        self.model: torch.nn.Module | None = None

    def configure_model(self) -> None:
        if self.model is None:
            cfg = AutoConfig.from_pretrained(self.model_dir)
            self.model = AutoModelForCausalLM.from_config(cfg)
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        assert self.model is not None
        loss = self.model(input_ids=batch, labels=batch).loss
        print(f"step {batch_idx + 1} loss {loss.item():.4f}", flush=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return DeepSpeedCPUAdam(self.parameters(), lr=1e-4)


def main() -> None:
    model_dir, nvme = sys.argv[1], sys.argv[2]
    steps, seq, micro = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (steps * micro, seq), generator=g)
    data = torch.utils.data.DataLoader(ids, batch_size=micro)
    strategy = DeepSpeedStrategy(
        stage=3,
        offload_optimizer=True,
        offload_optimizer_device="nvme",
        nvme_path=nvme,
    )
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        strategy=strategy,
        precision="bf16-mixed",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(CausalLM(model_dir), data)


if __name__ == "__main__":
    main()
