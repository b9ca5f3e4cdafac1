"""The training worker's model (iotune.workers.train): a spec's model config as transformers'
config and the class to build, and the model built inside DeepSpeed's zero.Init, each
weight initialised in its module's constructor before its partition is taken. torch and
DeepSpeed are the caller's; transformers is imported when a config is read. Imported, never
run as a worker."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def _init_in_constructors(torch: Any, std: float) -> Iterator[None]:
    """Every weight initialised as transformers' _init_weights does, inside its module's
    constructor: before zero.Init partitions it. nn.Linear and nn.Embedding get
    normal(0, std), a zero bias and a zero padding row; any other parameter of two or more
    dimensions (a Mixtral's fused experts, its router: torch.empty until _init_weights)
    gets normal(0, std) as it is registered. Linear and Embedding are marked initialised, so
    the model's post_init leaves them alone: on a partition (an empty tensor) it would index
    the padding row and fail; for the rest it touches only empty partitions, and without
    this their memory would train as it was left (NaN losses, optimizer steps skipped)."""
    nn = torch.nn
    saved = nn.Linear.reset_parameters, nn.Embedding.reset_parameters
    saved_register = nn.Module.register_parameter

    def linear(self: Any) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self._is_hf_initialized = True

    def embedding(self: Any) -> None:
        nn.init.normal_(self.weight, mean=0.0, std=std)
        if self.padding_idx is not None:
            with torch.no_grad():
                self.weight[self.padding_idx].fill_(0)
        self._is_hf_initialized = True

    def register(self: Any, name: str, param: Any) -> None:
        saved_register(self, name, param)
        fresh = param is not None and not hasattr(param, "ds_id")  # not yet partitioned
        if fresh and param.dim() >= 2 and not isinstance(self, (nn.Linear, nn.Embedding)):
            with torch.no_grad():
                nn.init.normal_(param, mean=0.0, std=std)

    nn.Linear.reset_parameters, nn.Embedding.reset_parameters = linear, embedding
    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Linear.reset_parameters, nn.Embedding.reset_parameters = saved
        nn.Module.register_parameter = saved_register


def model_config(model: dict[str, Any]) -> tuple[Any, Any]:
    """A spec's model (a config.json's fields) as transformers' config, and the class
    AutoModelForCausalLM picks for it, to be built directly: inside zero.Init as it is."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    fields = dict(model)
    mcfg = CONFIG_MAPPING[str(fields.pop("model_type", "llama"))].from_dict(fields)
    mcfg.use_cache = False
    return mcfg, AutoModelForCausalLM._model_mapping[type(mcfg)]


def build_partitioned(
    torch: Any, deepspeed: Any, mcfg: Any, model_class: Any, ds_config: dict[str, Any]
) -> Any:
    """The model built inside zero.Init, which partitions (and with offload_param swaps out)
    each parameter as soon as its module is built, so a model larger than GPU or host memory
    can be built at all. Each module's constructor initialises its weights before that
    (normal(0, initializer_range) as transformers' _init_weights would), so every partition
    is written once: re-initialising afterwards would gather each one back, reading and
    writing it all again."""
    std = float(getattr(mcfg, "initializer_range", 0.02))
    with _init_in_constructors(torch, std), deepspeed.zero.Init(config_dict_or_path=ds_config):
        return model_class(mcfg)
