"""Worker: a Hugging Face causal-LM built from its config.json on torch's meta device (no
memory allocated, no weights read) and reported as what ZeRO-3 partitions and swaps: every
parameter tensor in model.parameters() order with its element count, and the tensors a tied
module shares (lm_head tied to the embedding: DeepSpeed's zero.Init partitions and swaps
the module's own weight before transformers ties it).

usage: python -m iotune.workers.model_meta PATH   (a model directory or its config.json)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from iotune.workers import private_stdout

#: config.json keys that describe the file, not the model
NOT_MODEL = ("transformers_version", "_name_or_path", "torch_dtype", "dtype")


def describe(path: str) -> dict[str, Any]:
    """The model's config and tensors, or {"error": ..., "hint": ...}."""
    p = Path(path)
    folder = p.parent if p.name == "config.json" or p.is_file() else p
    if not (folder / "config.json").is_file():
        return {
            "error": f"{path}: no config.json there",
            "hint": "point --model at a Hugging Face model folder (with config.json) or the file",
        }
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        cfg = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (ValueError, KeyError, OSError) as exc:
        return {
            "error": f"{folder / 'config.json'}: transformers cannot read it: {_one(exc)}",
            "hint": "its model_type must be one this transformers knows "
            "(python -c 'import transformers; print(transformers.__version__)')",
        }
    if hasattr(cfg, "use_cache"):
        cfg.use_cache = False
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)  # type: ignore[no-untyped-call]
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        return {
            "error": f"{cfg.model_type}: no causal-LM model can be built from this config: "
            f"{_one(exc)}",
            "hint": "iotune trains decoder models that AutoModelForCausalLM builds",
        }
    own = [(n, int(t.numel())) for n, t in model.named_parameters()]
    seen = {n for n, _ in own}
    tied = [
        (n, int(t.numel()))
        for n, t in model.named_parameters(remove_duplicate=False)
        if n not in seen
    ]
    d = cfg.to_dict()
    config = {k: v for k, v in d.items() if k not in NOT_MODEL}
    text = getattr(cfg, "get_text_config", lambda: cfg)()
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    inter = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None)
    return {
        "model_type": cfg.model_type,
        "architecture": type(model).__name__,
        "config": config,
        "tensors": own,
        "tied": tied,
        "hidden_size": hidden,
        "intermediate_size": int(inter) if inter else 4 * hidden,
        "num_hidden_layers": int(getattr(text, "num_hidden_layers", 1) or 1),
        "num_attention_heads": int(getattr(text, "num_attention_heads", 1) or 1),
        "num_key_value_heads": int(
            getattr(text, "num_key_value_heads", None)
            or getattr(text, "num_attention_heads", 1)
            or 1
        ),
        "vocab_size": int(getattr(text, "vocab_size", 0) or 0),
        "max_position_embeddings": int(getattr(text, "max_position_embeddings", 0) or 0),
    }


def _one(exc: BaseException) -> str:
    lines = [x for x in str(exc).strip().splitlines() if x.strip()]
    return lines[0] if lines else type(exc).__name__


def main() -> None:
    report = private_stdout()
    report.write(json.dumps(describe(sys.argv[1])) + "\n")
    report.flush()


if __name__ == "__main__":
    main()
