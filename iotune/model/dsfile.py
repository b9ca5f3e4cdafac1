"""A user's DeepSpeed config (--ds-config) read as DeepSpeed reads it: the JSON (or the config
accelerate makes of its own YAML, iotune.model.accel), a Trainer config's "auto" values filled
by transformers' own integration as the Trainer fills them, then checked by DeepSpeed's own
config classes (iotune.workers.ds_config_check): one line on the first thing DeepSpeed would
reject, and the keys it ignores, as advice. Its workers, and iotune.model.custom's that
builds the user's model, run through run_worker: a failure is one line."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.errors import CommandFailed
from iotune.model.presets import PresetError


def run_worker(module: str, arg: str, what: str) -> dict[str, Any]:
    """The document the worker *module* answers for *arg*; its failure one line saying *what*
    failed, with where to look."""
    try:
        return proc.run_worker(module, arg, timeout=600)
    except CommandFailed as exc:
        raise PresetError(
            f"{what} failed: {exc.message}",
            hint="'iotune doctor --for train' shows whether torch and transformers import",
        ) from exc


#: aio keys DeepSpeed's runtime no longer reads, and what replaced them
RENAMED_AIO = {
    "thread_count": (
        "intra_op_parallelism",
        "renamed intra_op_parallelism in DeepSpeed 0.16.4; the runtime reads only the new "
        "key, so this one is ignored and intra_op_parallelism keeps its default (1)",
    ),
}
#: where the Trainer takes each "auto" value from (transformers.integrations.deepspeed),
#: said beside what iotune filled; keys not listed take TrainingArguments' defaults
AUTO_FROM = {
    "train_micro_batch_size_per_gpu": "--micro-batch (the Trainer's per_device_train_batch_size)",
    "gradient_accumulation_steps": "--ga (the Trainer's gradient_accumulation_steps)",
    "train_batch_size": "ranks x micro-batch x accumulation",
    "bf16.enabled": "--set dtype (the Trainer's bf16)",
    "fp16.enabled": "the Trainer's fp16 (off: iotune does not model fp16)",
    "zero_optimization.reduce_bucket_size": "hidden_size^2 of the model",
    "zero_optimization.stage3_prefetch_bucket_size": "0.9 x hidden_size^2 of the model",
    "zero_optimization.stage3_param_persistence_threshold": "10 x hidden_size of the model",
    "scheduler.params.total_num_steps": "--steps",
}


def auto_keys(cfg: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose value is "auto" (Hugging Face Trainer configs)."""
    if not isinstance(cfg, dict):
        return []
    out = []
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if v == "auto":
            out.append(key)
        elif isinstance(v, dict):
            out += auto_keys(v, key + ".")
    return out


def _get(cfg: dict[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def fill_auto(
    cfg: dict[str, Any],
    path: str,
    model: str,
    *,
    micro_batch: int | None,
    ga: int | None,
    ranks: int,
    dtype: str | None,
    steps: int,
) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """A Trainer config's "auto" values filled by transformers' own integration, as the
    Trainer fills them from its arguments and the model; and (key, value, from what) for
    each value filled."""
    keys = auto_keys(cfg)
    if not keys:
        return cfg, []
    needs_batch = [k for k in ("train_micro_batch_size_per_gpu", "train_batch_size") if k in keys]
    mb_given = isinstance(cfg.get("train_micro_batch_size_per_gpu"), int)
    if needs_batch and micro_batch is None and not mb_given:
        raise PresetError(
            f'{path}: {needs_batch[0]} is "auto": the Trainer fills it from its '
            "per_device_train_batch_size, which iotune cannot see",
            hint="pass --micro-batch N (your per_device_train_batch_size)",
        )
    if "bf16.enabled" in keys and dtype is None:
        raise PresetError(
            f'{path}: bf16.enabled is "auto": the Trainer fills it from its bf16 argument, '
            "which iotune cannot see",
            hint="pass --set dtype=bf16 (TrainingArguments(bf16=True)) or --set dtype=fp32",
        )
    cfg_ga = cfg.get("gradient_accumulation_steps")
    use_mb = micro_batch or (cfg["train_micro_batch_size_per_gpu"] if mb_given else 1)
    args = {
        "per_device_train_batch_size": use_mb,
        "gradient_accumulation_steps": ga or (cfg_ga if isinstance(cfg_ga, int) else 1),
        "world_size": ranks,
        "bf16": dtype == "bf16",
    }
    req = {"config": cfg, "model": str(Path(model).resolve()), "args": args, "steps": steps}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:
        json.dump(req, fh)
        fh.flush()
        doc = run_worker("iotune.workers.ds_auto", fh.name, 'filling the config\'s "auto" values')
    if "error" in doc:
        raise PresetError(
            f'{path}: transformers cannot fill its "auto" values: {doc["error"]}',
            hint='replace the "auto" it names with a value',
        )
    filled: dict[str, Any] = doc["config"]
    return filled, [
        (k, json.dumps(_get(filled, k)), AUTO_FROM.get(k, "TrainingArguments' default"))
        for k in keys
    ]


def warmup_below_one(
    cfg: dict[str, Any], filled: list[tuple[str, str, str]]
) -> list[tuple[str, str]]:
    """transformers before its max(1, ...) fills an "auto" warmup_num_steps with
    TrainingArguments' warmup_steps (0 by default) as it is, and DeepSpeed from 0.19.6
    refuses it in deepspeed.initialize ("warmup_num_steps must be a positive integer"). The
    user's Trainer stops there; iotune's own runs of the config take 1 (changed in *cfg*)."""
    warmup = _get(cfg, "scheduler.params.warmup_num_steps")
    if not (isinstance(warmup, int) and warmup < 1):
        return []
    if not any(k == "scheduler.params.warmup_num_steps" for k, _, _ in filled):
        return []
    cfg["scheduler"]["params"]["warmup_num_steps"] = 1
    return [
        (
            "scheduler.params.warmup_num_steps",
            f'"auto" is filled with {warmup} by this transformers from TrainingArguments\' '
            "default warmup_steps, and DeepSpeed refuses a warmup below 1 step: your Trainer "
            "stops in deepspeed.initialize unless its warmup_steps is 1 or more; iotune's own "
            "runs of this config take 1",
        )
    ]


def read_ds_config(
    path: str, fill: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[tuple[str, str]], list[tuple[str, str, str]]]:
    """The JSON at *path* (or the config accelerate makes of its own YAML, iotune.model.accel),
    its "auto" values filled (with *fill*: fill_auto's arguments), checked by DeepSpeed's own
    config classes: one line on the first thing DeepSpeed would reject; the keys DeepSpeed
    ignores, as advice; and the "auto" values filled."""
    from iotune.model.accel import accelerate_doc, read_accelerate_config

    p = Path(path)
    notes: list[tuple[str, str]] = []
    filled: list[tuple[str, str, str]] = []
    accelerate = False
    try:
        cfg = json.loads(p.read_text())
    except OSError as exc:
        raise PresetError(f"cannot read {path}: {exc.strerror}", hint="check the path") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        if accelerate_doc(path) is None:
            where = (
                f"{exc.msg} at line {exc.lineno} column {exc.colno}"
                if isinstance(exc, json.JSONDecodeError)
                else f"not UTF-8 text ({exc.reason} at byte {exc.start})"
            )
            raise PresetError(
                f"{path} is not JSON: {where}",
                hint="a DeepSpeed config is one JSON object (python -m json.tool shows where), "
                "or accelerate's YAML config (with distributed_type: DEEPSPEED)",
            ) from exc
        cfg, notes, filled = read_accelerate_config(path, fill)
        accelerate = True
    if not isinstance(cfg, dict):
        raise PresetError(f"{path} is not a JSON object", hint="a DeepSpeed config is {...}")
    if accelerate:
        pass  # filled as accelerate's own prepare() fills it
    elif fill is not None:
        cfg, filled = fill_auto(cfg, path, **fill)
    else:
        left = auto_keys(cfg)
        if left:
            raise PresetError(
                f'{path}: {left[0]} is "auto", which only the Hugging Face Trainer fills',
                hint="give its value, or pass the config with --model so iotune fills it",
            )
    for k in ("fp16",):
        if isinstance(cfg.get(k), dict) and cfg[k].get("enabled"):
            raise PresetError(
                f"{path}: fp16 training is not modelled (its loss scaling may skip steps)",
                hint='use "bf16": {"enabled": true}, or leave both off for float32',
            )
    zo = cfg.get("zero_optimization", {})
    if isinstance(zo, dict) and "aio" in zo:
        raise PresetError(
            f"{path}: aio is inside zero_optimization, where DeepSpeed rejects it (its zero "
            "config permits no extra keys)",
            hint='move "aio" to the top level of the config, where DeepSpeed reads it',
        )
    if isinstance(zo, dict):
        for sec in ("offload_optimizer", "offload_param"):
            off = zo.get(sec)
            if isinstance(off, dict) and off.get("device") == "nvme" and not off.get("nvme_path"):
                raise PresetError(
                    f"{path}: zero_optimization.{sec} is on nvme without an nvme_path",
                    hint=f'add "nvme_path": "/mnt/nvme" to zero_optimization.{sec}',
                )
    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:
        json.dump(cfg, fh)
        fh.flush()
        report = run_worker(
            "iotune.workers.ds_config_check", fh.name, "checking the DeepSpeed config"
        )
    if report.get("errors"):
        raise PresetError(
            f"{path}: DeepSpeed rejects it: {report['errors'][0]}",
            hint="see DeepSpeed's config reference (deepspeed.ai/docs/config-json)",
        )
    notes += warmup_below_one(cfg, filled)
    for key in report.get("ignored") or []:
        new_key, why = RENAMED_AIO.get(key, (None, "not a key DeepSpeed's aio config has"))
        notes.append(
            (
                f"aio.{key}",
                f"DeepSpeed ignores it ({why})"
                + (f"; set aio.{new_key} instead" if new_key else "; remove it"),
            )
        )
    return cfg, notes, filled
