"""A user's model and DeepSpeed config as a preset (--model, --ds-config): the model's real
parameter tensors (built on the meta device by iotune.workers.model_meta), the config read
as DeepSpeed reads it (iotune.workers.ds_config_check), and the batch geometry from the
flags, the config, or the defaults, in that order. Everything the presets feed (estimate,
run, trace, study, the planner) then works on it unchanged."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.errors import CommandFailed
from iotune.train.presets import (
    ModelGeometry,
    Preset,
    PresetError,
    Strategy,
    apply_sets,
    parse_sets,
)
from iotune.workers import command as worker_command
from iotune.workers import worker_env

#: the sequence length where neither --seq-len nor the model says one
DEFAULT_SEQ_LEN = 2048


def _worker(module: str, arg: str, what: str) -> dict[str, Any]:
    try:
        done = proc.run(worker_command(module, arg), timeout=600, env=worker_env())
        return proc.worker_json(done)
    except CommandFailed as exc:
        raise PresetError(
            f"{what} failed: {exc.message}",
            hint="'iotune doctor --for train' shows whether torch and transformers import",
        ) from exc


def load_model(path: str) -> ModelGeometry:
    """The model at *path* (a folder with config.json, or the file) as transformers builds it."""
    doc = _worker("iotune.workers.model_meta", str(Path(path).resolve()), "reading the model")
    if "error" in doc:
        raise PresetError(doc["error"], hint=doc.get("hint"))
    if not doc["tensors"]:
        raise PresetError(f"{path}: the model has no parameters", hint="check its config.json")
    return ModelGeometry(
        hidden_size=doc["hidden_size"],
        intermediate_size=doc["intermediate_size"],
        num_hidden_layers=doc["num_hidden_layers"],
        num_attention_heads=doc["num_attention_heads"],
        num_key_value_heads=doc["num_key_value_heads"],
        tie_word_embeddings=bool(doc["tied"]),
        vocab_size=doc["vocab_size"],
        max_position_embeddings=doc["max_position_embeddings"] or DEFAULT_SEQ_LEN,
        source=str(path),
        architecture=doc["architecture"],
        type_name=doc["model_type"],
        config=doc["config"],
        params=tuple((str(n), int(k)) for n, k in doc["tensors"]),
        tied=tuple((str(n), int(k)) for n, k in doc["tied"]),
    )


def read_ds_config(path: str) -> dict[str, Any]:
    """The JSON at *path*, checked by DeepSpeed's own config classes: one line on the first
    thing DeepSpeed would reject."""
    p = Path(path)
    try:
        cfg = json.loads(p.read_text())
    except OSError as exc:
        raise PresetError(f"cannot read {path}: {exc.strerror}", hint="check the path") from exc
    except json.JSONDecodeError as exc:
        raise PresetError(
            f"{path} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            hint="a DeepSpeed config is one JSON object (python -m json.tool shows where)",
        ) from exc
    if not isinstance(cfg, dict):
        raise PresetError(f"{path} is not a JSON object", hint="a DeepSpeed config is {...}")
    for k in ("fp16",):
        if isinstance(cfg.get(k), dict) and cfg[k].get("enabled"):
            raise PresetError(
                f"{path}: fp16 training is not modelled (its loss scaling may skip steps)",
                hint='use "bf16": {"enabled": true}, or leave both off for float32',
            )
    zo = cfg.get("zero_optimization", {})
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
        report = _worker("iotune.workers.ds_config_check", fh.name, "checking the DeepSpeed config")
    if report.get("errors"):
        raise PresetError(
            f"{path}: DeepSpeed rejects it: {report['errors'][0]}",
            hint="see DeepSpeed's config reference (deepspeed.ai/docs/config-json)",
        )
    return cfg


def _device(zo: dict[str, Any], sec: str) -> str | None:
    off = zo.get(sec)
    return str(off.get("device")) if isinstance(off, dict) and off.get("device") else None


def strategy_of(cfg: dict[str, Any], path: str) -> Strategy:
    """The strategy a config amounts to (where the optimizer state and parameters live)."""
    zo = cfg.get("zero_optimization", {}) or {}
    opt = _device(zo, "offload_optimizer")
    par = _device(zo, "offload_param")
    return Strategy(
        name="custom",
        about=f"your DeepSpeed config {path}",
        stage=int(zo.get("stage", 0)),
        optimizer=opt if opt in ("cpu", "nvme") else "gpu",
        params=par if par in ("cpu", "nvme") else "gpu",
        zenflow=isinstance(zo.get("zenflow"), dict),
        gradient_checkpointing=True,
        zero_init=True,
    )


def custom_preset(
    model: str,
    ds_config_path: str,
    *,
    micro_batch: int | None = None,
    seq_len: int | None = None,
    ga: int | None = None,
    ranks: int | None = None,
    sets: tuple[str, ...] = (),
    steps: int | None = None,
) -> Preset:
    """A preset for the user's model and config; the flags win over the config's values."""
    cfg = read_ds_config(ds_config_path)
    geometry = load_model(model)
    s = strategy_of(cfg, ds_config_path)
    world = max(1, ranks or 1)
    cfg_ga = cfg.get("gradient_accumulation_steps")
    cfg_mb = cfg.get("train_micro_batch_size_per_gpu")
    use_ga = int(ga or (cfg_ga if isinstance(cfg_ga, int) and cfg_ga > 0 else 1))
    if micro_batch:
        use_mb = micro_batch
    elif isinstance(cfg_mb, int) and cfg_mb > 0:
        use_mb = cfg_mb
    elif isinstance(cfg.get("train_batch_size"), int):
        use_mb = max(1, int(cfg["train_batch_size"]) // (use_ga * world))
    else:
        use_mb = 1
    zo = cfg.get("zero_optimization", {}) or {}
    nvme = next(
        (
            str(zo[sec]["nvme_path"])
            for sec in ("offload_optimizer", "offload_param")
            if _device(zo, sec) == "nvme"
        ),
        None,
    )
    bf16 = isinstance(cfg.get("bf16"), dict) and bool(cfg["bf16"].get("enabled"))
    name = f"{Path(model).resolve().name}+{Path(ds_config_path).stem}"
    p = Preset(
        name=name,
        size="custom",
        geometry=geometry,
        strategy=s,
        ga=use_ga,
        micro_batch=use_mb,
        seq_len=seq_len or min(DEFAULT_SEQ_LEN, geometry.max_position_embeddings),
        steps=5,
        accelerator="cuda",
        nvme_path=nvme,
        deepspeed=cfg,
        gradient_checkpointing=True,
        ranks=world,
        dtype="bf16" if bf16 else "fp32",
        ds_user=True,
    )
    overrides = parse_sets(sets)
    if steps is not None:
        overrides["steps"] = steps
    return apply_sets(p, overrides)


def pick_preset(
    name: str | None,
    model: str | None = None,
    ds_config: str | None = None,
    *,
    micro_batch: int | None = None,
    seq_len: int | None = None,
    ga: int | None = None,
    ranks: int | None = None,
    sets: tuple[str, ...] = (),
    steps: int | None = None,
) -> Preset:
    """A preset by name, or the user's --model with --ds-config; one line where the
    combination makes no sense."""
    from iotune.errors import UsageError
    from iotune.train.presets import preset_with

    if model or ds_config:
        if name:
            raise UsageError(
                f"give a preset ({name}) or --model with --ds-config, not both",
                hint="iotune estimate --model ./my-model --ds-config ds_config.json",
            )
        if not (model and ds_config):
            missing = "--ds-config" if model else "--model"
            raise UsageError(
                f"{missing} is missing: --model and --ds-config go together",
                hint="iotune estimate --model ./my-model --ds-config ds_config.json",
            )
        return custom_preset(
            model,
            ds_config,
            micro_batch=micro_batch,
            seq_len=seq_len,
            ga=ga,
            ranks=ranks,
            sets=sets,
            steps=steps,
        )
    if not name:
        raise UsageError(
            "name a preset, or your model with --model DIR --ds-config FILE",
            hint="'iotune presets list' shows the presets",
        )
    extra = tuple(
        f"{k}={v}"
        for k, v in (("micro_batch", micro_batch), ("seq_len", seq_len), ("ga", ga))
        if v is not None
    )
    return preset_with(name, (*sets, *extra), steps)
