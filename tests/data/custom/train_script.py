"""A user's own DeepSpeed training script, as plain as they come: a causal LM built from a
config.json inside zero.Init, the DeepSpeed config given, random tokens, N optimizer steps.
iotune knows nothing of it beyond its command line (the root tier traces it with
`iotune trace --model ... --ds-config ... -- python train_script.py ...`).

usage: python train_script.py MODEL_DIR DS_CONFIG STEPS SEQ_LEN [INIT_PAUSE]

INIT_PAUSE (seconds, for the tests) slows DeepSpeed's initialisation where a GPU host's is
slow: between the fp32 masters' first write and initialize_optimizer_states' rewrite.
With SAVE_DIR in the environment, the steps end with a save there, its swap files copied as
iotune's docs tell a user to (SAVE_COPY: aio, reflink or deepspeed; aio if not given), and
each copy's record printed as a line "copy: {json}".
"""

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
    os.environ.setdefault(k, v)
os.environ.setdefault("MASTER_PORT", "29533")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from transformers import AutoConfig  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING  # noqa: E402


def slow_initialisation(pause: float) -> None:
    import time

    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    init = Stage3.initialize_optimizer_states

    def slowed(self: Stage3) -> None:
        time.sleep(pause)
        init(self)

    Stage3.initialize_optimizer_states = slowed


def main() -> None:
    # DeepSpeed's launcher passes --local_rank=N (without --no_local_rank), as to any script
    sys.argv = [a for a in sys.argv if not a.startswith("--local_rank")]
    model_dir, ds_path, steps, seq_len = (
        sys.argv[1],
        sys.argv[2],
        int(sys.argv[3]),
        int(sys.argv[4]),
    )
    if len(sys.argv) > 5:
        slow_initialisation(float(sys.argv[5]))
    with open(ds_path) as fh:
        ds_config = json.load(fh)
    gpu = os.environ["DS_ACCELERATOR"] == "cuda"
    deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo", verbose=False)
    cfg = AutoConfig.from_pretrained(model_dir)
    cfg.use_cache = False
    torch.manual_seed(0)
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(cfg)]  # its module imported out here
    with deepspeed.zero.Init(config_dict_or_path=ds_config):
        model = model_class(cfg)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config,
    )
    engine.train()
    ga = int(ds_config.get("gradient_accumulation_steps", 1))
    for step in range(steps):
        for _ in range(ga):
            ids = torch.randint(
                0, cfg.vocab_size, (int(ds_config["train_micro_batch_size_per_gpu"]), seq_len)
            ).to(engine.device)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
        print(f"step {step + 1} loss {loss.item():.4f}", flush=True)
    if os.environ.get("SAVE_DIR"):
        from iotune.workers.swapcopy import swap_copies

        with swap_copies(os.environ.get("SAVE_COPY", "aio")) as copies:
            engine.save_checkpoint(os.environ["SAVE_DIR"], tag=f"step{steps}")
        for rec in copies:
            print("copy: " + json.dumps(rec.as_dict()), flush=True)


if __name__ == "__main__":
    main()
