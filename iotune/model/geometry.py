"""A model's geometry: the sizes a preset's Llama is built from (Llama-3.1's settings where
its size in configs/presets.toml says no other) and every parameter tensor they make, in
model.parameters() order; or a user's model (--model) with its real tensors, as transformers
builds it. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

#: Llama-3.1-8B's settings that every size shares unless its table says otherwise
LLAMA31 = {
    "vocab_size": 128256,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
}


@dataclass(frozen=True)
class Geometry:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    tie_word_embeddings: bool
    vocab_size: int = 128256
    num_key_value_heads: int = 8
    max_position_embeddings: int = 131072
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    hidden_act: str = "silu"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def tensors(self) -> list[tuple[str, int]]:
        """Every parameter tensor of LlamaForCausalLM, in model.parameters() order, with numel."""
        h, i, kv = (
            self.hidden_size,
            self.intermediate_size,
            self.num_key_value_heads * self.head_dim,
        )
        out = [("model.embed_tokens.weight", self.vocab_size * h)]
        for n in range(self.num_hidden_layers):
            p = f"model.layers.{n}."
            out += [
                (p + "self_attn.q_proj.weight", h * h),
                (p + "self_attn.k_proj.weight", h * kv),
                (p + "self_attn.v_proj.weight", h * kv),
                (p + "self_attn.o_proj.weight", h * h),
                (p + "mlp.gate_proj.weight", h * i),
                (p + "mlp.up_proj.weight", h * i),
                (p + "mlp.down_proj.weight", i * h),
                (p + "input_layernorm.weight", h),
                (p + "post_attention_layernorm.weight", h),
            ]
        out.append(("model.norm.weight", h))
        if not self.tie_word_embeddings:  # a tied lm_head is the embedding itself
            out.append(("lm_head.weight", self.vocab_size * h))
        return out

    def tied_tensors(self) -> list[tuple[str, int]]:
        """Module weights that transformers replaces by another's (lm_head by the embedding),
        with the numel each had when its module was built."""
        return (
            [("lm_head.weight", self.vocab_size * self.hidden_size)]
            if self.tie_word_embeddings
            else []
        )

    def param_count(self) -> int:
        return sum(n for _, n in self.tensors())

    @property
    def model_type(self) -> str:
        return "llama"

    @property
    def family(self) -> str:
        return "Llama"

    def llama_config(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(Geometry)}
        d["head_dim"] = self.head_dim
        return d

    def model_config(self) -> dict[str, Any]:
        """The transformers config the worker builds the model from (with model_type)."""
        return self.llama_config()

    def describe(self) -> str:
        return (
            f"h{self.hidden_size} i{self.intermediate_size} L{self.num_hidden_layers} "
            f"heads {self.num_attention_heads}/{self.num_key_value_heads} "
            f"vocab {self.vocab_size}{' tied' if self.tie_word_embeddings else ''}"
        )


@dataclass(frozen=True)
class ModelGeometry(Geometry):
    """A user's model (--model): its config.json and its real parameter tensors, as
    transformers builds it (iotune.workers.model_meta, on the meta device)."""

    source: str = ""
    architecture: str = ""
    type_name: str = "llama"
    config: dict[str, Any] = field(default_factory=dict, compare=False)
    params: tuple[tuple[str, int], ...] = ()
    tied: tuple[tuple[str, int], ...] = ()

    def tensors(self) -> list[tuple[str, int]]:
        return list(self.params)

    def tied_tensors(self) -> list[tuple[str, int]]:
        return list(self.tied)

    @property
    def model_type(self) -> str:
        return self.type_name

    @property
    def family(self) -> str:
        return self.architecture or self.type_name

    def model_config(self) -> dict[str, Any]:
        return {**self.config, "model_type": self.type_name}

    def describe(self) -> str:
        return (
            f"h{self.hidden_size} L{self.num_hidden_layers} vocab {self.vocab_size}"
            f"{' tied' if self.tied else ''}, {len(self.params)} tensors"
        )
