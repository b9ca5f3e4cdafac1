"""The DeepSpeed config of a preset: ZeRO stage and offload, the aio block, ZenFlow, the
--set ds.* keys; and the checks that refuse what DeepSpeed would silently misread (NVMe
offload below stage 3, ZenFlow where it fails)."""

from __future__ import annotations

import copy
from typing import Any

from iotune.model.presets import Preset, PresetError, resolve_dtype

#: DeepSpeed's aio block where a config gives none (runtime/swap_tensor/constants.py
#: AIO_BLOCK_SIZE_DEFAULT): the focus size of a run or a trace of such a config
DEFAULT_AIO_BLOCK = 1 << 20


def _set_dotted(d: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    for p in parts[:-1]:
        nxt = d.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise PresetError(f"ds.{dotted}: {p} is not a section", hint="check the key path")
        d = nxt
    d[parts[-1]] = value


# ----------------------------------------------------------------------------- DeepSpeed config


def ds_config(
    preset: Preset, nvme_path: str | None = None, aio: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The DeepSpeed config a preset runs with. Refuses NVMe below ZeRO stage 3: DeepSpeed
    swaps to NVMe only in stage 3 (stages 1 and 2 silently keep "nvme" state in CPU RAM)."""
    if preset.ds_user:
        return _user_config(preset, nvme_path, aio)
    s = preset.strategy
    base = copy.deepcopy(preset.deepspeed)
    zen = base.pop("zenflow", None)
    zero3 = base.pop("zero_optimization", {})
    aio_block = aio if aio is not None else base.get("aio")
    base.pop("aio", None)
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": preset.micro_batch,
        "gradient_accumulation_steps": preset.ga,
        **base,
    }
    path = nvme_path or preset.nvme_path
    zo: dict[str, Any] = {"stage": s.stage, **(zero3 if s.stage == 3 else {})}
    if s.optimizer == "gpu":
        # torch's Adam on the GPU: DeepSpeed's FusedAdam would need nvcc for a JIT build
        cfg["optimizer"] = copy.deepcopy(cfg["optimizer"])
        cfg["optimizer"]["params"]["torch_adam"] = True
    elif s.optimizer == "cpu":
        zo["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    else:
        zo["offload_optimizer"] = {
            "device": "nvme",
            "nvme_path": path,
            "pin_memory": True,
            "buffer_count": 4,
        }
    if s.params == "nvme":
        # One buffer holds one parameter, so each must fit the largest (the embedding:
        # partitioned_param_swapper.py asserts numel <= buffer_size). A parameter is released
        # after use unless it comes back within stage3_max_reuse_distance elements; at 0 the
        # buffers in use are one module's parameters and the prefetched ones, so a dozen do,
        # where the default (1e9) keeps several layers' worth and needs dozens of
        # embedding-sized buffers. max_in_cpu 0: every parameter streams from the drive;
        # DeepSpeed's default (1e9 elements) would read the optimizer's first sub-groups up
        # to 1e9 elements into CPU memory once and never touch their files again
        # (zero/stage3.py:888-911, 984-993; iotune.model.swapfiles.parameter_placement).
        zo["offload_param"] = {
            "device": "nvme",
            "nvme_path": path,
            "pin_memory": True,
            "buffer_count": 12,
            "buffer_size": max(n for _, n in preset.geometry.tensors()),
            "max_in_cpu": 0,
        }
        zo["stage3_max_reuse_distance"] = 0
    if s.zenflow and zen:
        zo["zenflow"] = dict(zen)
    if s.stage:
        zo["overlap_comm"] = True
        zo["contiguous_gradients"] = True
    cfg["zero_optimization"] = zo
    cfg["bf16"] = {**cfg.get("bf16", {}), "enabled": resolve_dtype(preset).name == "bf16"}
    if s.uses_nvme and aio_block:
        cfg["aio"] = dict(aio_block)
    for dotted, value in preset.ds_set.items():
        _set_dotted(cfg, dotted.removeprefix("ds."), value)
    check_ds_config(cfg, preset.name)
    check_zenflow(cfg, preset)
    return cfg


def _user_config(
    preset: Preset, nvme_path: str | None, aio: dict[str, Any] | None
) -> dict[str, Any]:
    """A user's config (--ds-config) as it is, but for what iotune owns: the batch (from
    --micro-batch/--ga or the config), the dtype (--set dtype), the run's own swap folder under
    the offload path, and a swept aio block (--aio-config)."""
    cfg = copy.deepcopy(preset.deepspeed)
    cfg.pop("train_batch_size", None)  # DeepSpeed derives it: micro-batch x ga x ranks
    cfg["train_micro_batch_size_per_gpu"] = preset.micro_batch
    cfg["gradient_accumulation_steps"] = preset.ga
    cfg["bf16"] = {**cfg.get("bf16", {}), "enabled": resolve_dtype(preset).name == "bf16"}
    zo = cfg.get("zero_optimization", {})
    if nvme_path and isinstance(zo, dict):
        for sec in ("offload_optimizer", "offload_param"):
            if isinstance(zo.get(sec), dict) and zo[sec].get("device") == "nvme":
                zo[sec]["nvme_path"] = nvme_path
    if aio is not None:
        cfg["aio"] = dict(aio)
    for dotted, value in preset.ds_set.items():
        _set_dotted(cfg, dotted.removeprefix("ds."), value)
    check_ds_config(cfg, preset.name)
    check_zenflow(cfg, preset)
    check_param_buffers(cfg, preset)
    return cfg


def check_param_buffers(cfg: dict[str, Any], preset: Preset) -> None:
    """Parameter offload to NVMe holds one parameter per buffer: a buffer smaller than the
    largest parameter fails DeepSpeed's assert in the first gather
    (partitioned_param_swapper.py), after minutes of start-up."""
    op = cfg.get("zero_optimization", {}).get("offload_param", {})
    if not isinstance(op, dict) or op.get("device") != "nvme":
        return
    name, largest = max(preset.geometry.tensors(), key=lambda t: t[1])
    size = int(op.get("buffer_size", 100_000_000))
    if size < largest:
        raise PresetError(
            f"{preset.name}: offload_param.buffer_size {size:,} is smaller than the largest "
            f"parameter, {name} ({largest:,} elements); DeepSpeed would fail its first gather",
            hint=f"set zero_optimization.offload_param.buffer_size to {largest} or more",
        )


#: how each setting differs from the study's runs, and why (shown by `iotune presets show`)
ZENFLOW_DIFFERENCES = (
    "gradient checkpointing off (the study had it on): ZenFlow transposes 2-D weights for its "
    "column selection and the recomputation sees them transposed ('mat1 and mat2 shapes cannot "
    "be multiplied'; DeepSpeed 0.18.3, the study's version, fails the same way)",
    "model built on the GPU, not inside zero.Init: zero.Init's early partitioning ends in a "
    "CUDA device-side assert in the first forward",
    "zenflow.overlap_step false: with true, the CPU update process has no overlap buffers for "
    "NVMe-swapped sub-groups ('no attribute overlap_grad')",
)


def study_differences(preset: Preset) -> tuple[str, ...]:
    """Every setting of this preset that differs from the study's runs, and why."""
    return ZENFLOW_DIFFERENCES if preset.strategy.zenflow else ()


def check_zenflow(cfg: dict[str, Any], preset: Preset) -> None:
    """Refuse the ZenFlow combinations that cannot run on DeepSpeed 0.19.8 (measured on an
    H100), before anything starts."""
    zo = cfg.get("zero_optimization", {})
    zen = zo.get("zenflow")
    if not isinstance(zen, dict):
        return
    where = f"{preset.name}: ZenFlow"
    if preset.accelerator != "cuda":
        raise PresetError(
            f"{where} needs a CUDA GPU: its stage-3 path allocates on 'cuda' whatever the "
            "accelerator (zenflow/engine_stage3.py update_selected_channels)",
            hint="run it on a CUDA host; the tiny_* CPU presets have no ZenFlow variant",
        )
    if zo.get("stage") == 3 and preset.gradient_checkpointing:
        raise PresetError(
            f"{where} with gradient checkpointing fails on the recomputation (its transposed "
            "2-D weights: 'mat1 and mat2 shapes cannot be multiplied')",
            hint="--set gradient_checkpointing=false",
        )
    if zen.get("overlap_step") and zo.get("offload_optimizer", {}).get("device") == "nvme":
        raise PresetError(
            f"{where} with overlap_step and the optimizer state on NVMe fails in the first "
            "step (no overlap buffers for swapped sub-groups: 'no attribute overlap_grad')",
            hint="--set ds.zero_optimization.zenflow.overlap_step=false",
        )


def nvme_devices(cfg: dict[str, Any]) -> list[str]:
    zo = cfg.get("zero_optimization", {})
    return [
        sec
        for sec in ("offload_optimizer", "offload_param")
        if isinstance(zo.get(sec), dict) and zo[sec].get("device") == "nvme"
    ]


def check_ds_config(cfg: dict[str, Any], name: str = "this config") -> None:
    zo = cfg.get("zero_optimization", {})
    if not isinstance(zo, dict):
        raise PresetError(
            f"{name}: zero_optimization must be a section", hint="ds.zero_optimization.stage=3"
        )
    stage = zo.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise PresetError(
            f"{name}: ZeRO stage must be 0, 1, 2 or 3, got {stage!r}",
            hint="ds.zero_optimization.stage=3",
        )
    for sec in ("offload_optimizer", "offload_param", "zenflow"):
        if sec in zo and not isinstance(zo[sec], dict):
            raise PresetError(
                f"{name}: zero_optimization.{sec} must be a section, got {zo[sec]!r}",
                hint=f"set its keys, e.g. ds.zero_optimization.{sec}.device=cpu",
            )
    aio = cfg.get("aio", {})
    for k in ("block_size", "queue_depth", "intra_op_parallelism"):
        v = aio.get(k, 1) if isinstance(aio, dict) else None
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PresetError(
                f"{name}: aio.{k} must be a positive integer (bytes for block_size), got {v!r}",
                hint="e.g. --set ds.aio.block_size=1048576",
            )
    on_nvme = nvme_devices(cfg)
    if on_nvme and stage < 3:
        raise PresetError(
            f"{name}: {' and '.join(on_nvme)} on NVMe needs ZeRO stage 3, got stage {stage} "
            "(DeepSpeed would silently keep that state in CPU RAM)",
            hint="use --set ds.zero_optimization.stage=3, or a RAM strategy",
        )
    for sec in on_nvme:
        if not zo[sec].get("nvme_path"):
            raise PresetError(
                f"{name}: {sec} on NVMe has no nvme_path", hint="pass --nvme-path DIR"
            )
    if zo.get("offload_param", {}).get("device") in ("cpu", "nvme") and stage < 3:
        raise PresetError(
            f"{name}: parameter offload needs ZeRO stage 3, got stage {stage}",
            hint="use --set ds.zero_optimization.stage=3",
        )


def model_element_size(cfg: dict[str, Any]) -> int:
    """Bytes per element of the model's parameters and gradients: 2 with bf16 or fp16
    enabled, else 4. DeepSpeed swaps parameters in this dtype (partitioned_param_swapper.py
    swap_element_size) and accumulates gradients in it (engine.py get_data_types); the fp32
    master and Adam's moments are fp32 whatever it is."""
    on = any(isinstance(cfg.get(k), dict) and cfg[k].get("enabled") for k in ("bf16", "fp16"))
    return 2 if on else 4


def min_aio_bytes(cfg: dict[str, Any]) -> int:
    """DeepSpeed swaps only tensors of at least max(1 MiB, aio.block_size) bytes
    (swap_tensor/utils.py MIN_AIO_BYTES, optimizer_utils.py min_aio_bytes)."""
    return max(1 << 20, int(cfg.get("aio", {}).get("block_size", DEFAULT_AIO_BLOCK)))
