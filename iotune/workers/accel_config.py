"""Worker: the DeepSpeed config `accelerate launch --config_file FILE` gives DeepSpeed, made by
accelerate's own code.

    python -m iotune.workers.accel_config REQUEST.json

REQUEST: {"path": FILE, "micro_batch": N|null, "ga": N|null, "ranks": N|null,
"model": DIR|null}. accelerate's loader reads the file (``load_config_from_file``, which
refuses what ``accelerate launch`` refuses); the launcher's own parser and checks turn it
into the arguments and the environment ``accelerate launch`` hands the training processes
(``_validate_launch_command``, ``prepare_deepspeed_cmd_env``); a ``DeepSpeedPlugin`` built
in that environment, with its mixed precision set, holds the config as the training
processes' ``Accelerator`` makes it. Its ``"auto"`` values are then filled as
``Accelerator.prepare`` fills them (``_prepare_deepspeed``): the micro-batch from the
DataLoader's batch size (iotune's --micro-batch), the accumulation from
``Accelerator(gradient_accumulation_steps=)`` (--ga, default 1), ``train_batch_size`` their
product with the processes, the bucket sizes from the model's hidden size,
``gradient_clipping`` 1.0, the optimizer's and scheduler's from ``DummyOptim`` and
``DummyScheduler``'s defaults. Prints one JSON line: the config, each value filled with
where it came from, notes, the number of processes; or {"error", "hint"}.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable
from typing import Any

from iotune.workers import report_json_request

#: the keys accelerate's _prepare_deepspeed fills from the model's hidden size h
HIDDEN_KEYS: dict[str, tuple[Callable[[int], int], str]] = {
    "zero_optimization.reduce_bucket_size": (lambda h: h * h, "hidden_size^2 of the model"),
    "zero_optimization.stage3_prefetch_bucket_size": (
        lambda h: int(0.9 * h * h),
        "0.9 x hidden_size^2 of the model",
    ),
    "zero_optimization.stage3_param_persistence_threshold": (
        lambda h: 10 * h,
        "10 x hidden_size of the model",
    ),
}
#: the launcher's fields naming a swap folder, and the config key each should become
NVME_FIELDS = {
    "offload_optimizer_nvme_path": (
        "zero_optimization.offload_optimizer",
        "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
    ),
    "offload_param_nvme_path": (
        "zero_optimization.offload_param",
        "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
    ),
}


def _autos(cfg: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(cfg, dict):
        for k, v in cfg.items():
            if v == "auto":
                out.append(prefix + k)
            else:
                out += _autos(v, f"{prefix}{k}.")
    return out


def _get(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _one(exc: BaseException) -> str:
    lines = [x for x in str(exc).strip().splitlines() if x.strip()]
    return lines[0] if lines else type(exc).__name__


def _defaults(fn: Any) -> dict[str, Any]:
    return {
        k: p.default
        for k, p in inspect.signature(fn).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def convert(req: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    path = req["path"]
    # untyped: accelerate's own code, called as `accelerate launch` and Accelerator call it
    config_args: Any = importlib.import_module("accelerate.commands.config.config_args")
    launch: Any = importlib.import_module("accelerate.commands.launch")
    utils: Any = importlib.import_module("accelerate.utils")
    launch_utils: Any = importlib.import_module("accelerate.utils.launch")
    load_config_from_file = config_args.load_config_from_file
    DeepSpeedPlugin, DistributedType = utils.DeepSpeedPlugin, utils.DistributedType
    DummyOptim, DummyScheduler = utils.DummyOptim, utils.DummyScheduler

    try:
        loaded = load_config_from_file(path)
    except (ValueError, TypeError, KeyError, OSError) as exc:
        return {
            "error": f"{path}: accelerate cannot read it: {_one(exc)}",
            "hint": "an accelerate config as 'accelerate config' writes it "
            "(compute_environment, distributed_type, deepspeed_config, ...)",
        }
    if getattr(loaded, "distributed_type", None) != DistributedType.DEEPSPEED:
        kind = getattr(loaded.distributed_type, "value", loaded.distributed_type)
        return {
            "error": f"{path}: distributed_type is {kind}: accelerate runs DeepSpeed only with "
            "DEEPSPEED",
            "hint": "set distributed_type: DEEPSPEED and its deepspeed_config: section",
        }
    yaml_ds: dict[str, Any] = dict(getattr(loaded, "deepspeed_config", None) or {})
    try:
        args = launch.launch_command_parser().parse_args(["--config_file", path, "train.py"])
        args, defaults, mp_from_config = launch._validate_launch_command(args)
        if not args.use_deepspeed or args.cpu:
            return {
                "error": f"{path}: accelerate launch runs it without DeepSpeed (use_cpu: true)",
                "hint": "set use_cpu: false; DeepSpeed's CPU accelerator is chosen by "
                "DS_ACCELERATOR=cpu",
            }
        fields = list(defaults.deepspeed_config) if defaults else []
        if mp_from_config:
            fields.append("mixed_precision")
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = launch_utils.prepare_deepspeed_cmd_env(args)
        # the training processes' environment, where their DeepSpeedPlugin reads it
        os.environ.update({k: v for k, v in env.items() if k.startswith("ACCELERATE_")})
        plugin = DeepSpeedPlugin()
        plugin.set_mixed_precision(env.get("ACCELERATE_MIXED_PRECISION", "no"))
    except (ValueError, TypeError, KeyError, OSError) as exc:
        return {
            "error": f"{path}: accelerate launch refuses it: {_one(exc)}",
            "hint": "'accelerate launch --config_file FILE script.py' says the same",
        }
    processes = int(req.get("ranks") or getattr(loaded, "num_processes", 1) or 1)
    cfg: dict[str, Any] = plugin.deepspeed_config
    notes: list[list[str]] = []
    for field, (section, env_key) in NVME_FIELDS.items():
        asked = yaml_ds.get(field)
        got = _get(cfg, f"{section}.nvme_path")
        if asked and str(asked) != "none" and got != asked:
            notes.append(
                [
                    f"{section}.nvme_path",
                    f"deepspeed_config.{field} is {asked}, but accelerate launch hands "
                    f"DeepSpeed {got!r}: it does not pass that field to the training "
                    f"processes, so DeepSpeed swaps to {got!r} (relative: under the folder "
                    f"the command starts in); set {env_key}={asked} in the environment as well",
                ]
            )
    autos = _autos(cfg)
    filled: dict[str, tuple[Any, str]] = {}
    mb: Any = _get(cfg, "train_micro_batch_size_per_gpu")
    if plugin.is_auto("train_micro_batch_size_per_gpu"):
        if not req.get("micro_batch"):
            return {
                "error": f'{path}: train_micro_batch_size_per_gpu is "auto": accelerate fills it '
                "from the batch_size of the DataLoader you prepare, which iotune cannot see",
                "hint": "pass --micro-batch N (your DataLoader's batch_size)",
            }
        mb = int(req["micro_batch"])
        filled["train_micro_batch_size_per_gpu"] = (mb, "--micro-batch (your DataLoader's)")
    ga_auto = plugin.is_auto("gradient_accumulation_steps")
    plugin.fill_match(
        "gradient_accumulation_steps",
        must_match=False,
        gradient_accumulation_steps=int(req.get("ga") or 1),
    )
    if ga_auto:
        filled["gradient_accumulation_steps"] = (
            int(req.get("ga") or 1),
            "--ga (Accelerator(gradient_accumulation_steps=), default 1)",
        )
    kwargs: dict[str, Any] = {
        "gradient_clipping": 1.0,
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
        "train_micro_batch_size_per_gpu": mb,
        "train_batch_size": int(mb)
        * int(plugin.get_value("gradient_accumulation_steps"))
        * processes,
    }
    froms = {
        "gradient_clipping": "accelerate's default",
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": "accelerate's default",
        "train_batch_size": "micro-batch x accumulation x processes",
    }
    if any(plugin.is_auto(k) for k in HIDDEN_KEYS):
        if not req.get("model"):
            return {
                "error": f"{path}: {next(k for k in HIDDEN_KEYS if plugin.is_auto(k))} is "
                '"auto": accelerate fills it from the model\'s hidden_size',
                "hint": "pass --model DIR",
            }
        transformers: Any = importlib.import_module("transformers")
        mc = transformers.AutoConfig.from_pretrained(req["model"])
        text = getattr(mc, "get_text_config", lambda: mc)()
        hidden = getattr(text, "hidden_size", None) or max(getattr(text, "hidden_sizes", [0]))
        for key, (fn, why) in HIDDEN_KEYS.items():
            kwargs[key] = fn(int(hidden))
            froms[key] = why
    opt, sched = _defaults(DummyOptim.__init__), _defaults(DummyScheduler.__init__)
    kwargs["optimizer.params.lr"] = opt.get("lr", 0.001)
    kwargs["optimizer.params.weight_decay"] = opt.get("weight_decay", 0)
    kwargs["scheduler.params.warmup_min_lr"] = 0
    kwargs["scheduler.params.warmup_max_lr"] = opt.get("lr", 0.001)
    kwargs["scheduler.params.warmup_num_steps"] = max(1, int(sched.get("warmup_num_steps", 0)))
    for key in (k for k in kwargs if k.startswith(("optimizer.", "scheduler."))):
        froms[key] = "accelerate's DummyOptim/DummyScheduler defaults"
    try:
        plugin.deepspeed_config_process(must_match=False, **kwargs)
    except ValueError as exc:
        # an "auto" accelerate has no value for (a config written for the Trainer, which
        # fills the optimizer's betas and eps itself): prepare() stops on it the same way
        left = [k for k in _autos(cfg) if k not in kwargs]
        return {
            "error": f'{path}: {left[0]} is "auto", which accelerate\'s prepare() has no value for'
            if left
            else f"{path}: accelerate cannot fill it: {_one(exc)}",
            "hint": "accelerate's prepare() fills the batch, accumulation, clipping, bucket "
            "sizes and a DummyOptim's lr and weight decay; a config for the Hugging Face "
            "Trainer is filled by the Trainer: pass its JSON as --ds-config",
        }
    for key in autos:
        if key not in filled:
            filled[key] = (_get(cfg, key), froms.get(key, "accelerate"))
    return {
        "config": cfg,
        "filled": [[k, v, why] for k, (v, why) in filled.items()],
        "notes": notes,
        "num_processes": processes,
    }


if __name__ == "__main__":
    report_json_request(convert)
