"""A user's model and DeepSpeed config as a preset (--model, --ds-config): the model's real
parameter tensors (built on the meta device by iotune.workers.model_meta), the config read
as DeepSpeed reads it (iotune.model.dsfile), and the batch geometry from the flags, the
config, or the defaults, in that order. Everything the presets feed (estimate,
run, trace, study, the planner) then works on it unchanged."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from iotune.model.dsfile import read_ds_config, run_worker
from iotune.model.geometry import ModelGeometry
from iotune.model.presets import (
    Preset,
    PresetError,
    Strategy,
    apply_sets,
    check_ds_value,
    parse_sets,
)

#: the sequence length where neither --seq-len nor the model says one
DEFAULT_SEQ_LEN = 2048


def model_config_file(path: str) -> Path:
    """The config.json a --model names: the file itself, or the one in the folder (as
    iotune.workers.model_meta finds it)."""
    p = Path(path)
    folder = p.parent if p.name == "config.json" or p.is_file() else p
    return folder / "config.json"


def check_model_config(path: str) -> None:
    """The model's config.json is there and is one JSON object, said before any worker
    starts: transformers reports a file that does not parse only as "not a valid JSON
    file", without where, and its other errors are about model_type."""
    f = model_config_file(path)
    try:
        doc = json.loads(f.read_bytes())
    except FileNotFoundError as exc:
        raise PresetError(
            f"{path}: no config.json there",
            hint="point --model at a Hugging Face model folder (with config.json) or the file",
        ) from exc
    except OSError as exc:
        raise PresetError(f"cannot read {f}: {exc.strerror}", hint="check the path") from exc
    except json.JSONDecodeError as exc:
        raise PresetError(
            f"{f} is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            hint="a model's config.json is one JSON object, as transformers saves it "
            "(python -m json.tool shows where)",
        ) from exc
    except UnicodeDecodeError as exc:
        raise PresetError(
            f"{f} is not JSON: not UTF-8 text ({exc.reason} at byte {exc.start})",
            hint="a model's config.json is one JSON object in UTF-8, as transformers saves it",
        ) from exc
    if not isinstance(doc, dict):
        raise PresetError(
            f"{f} is not a JSON object",
            hint="a model's config.json is {...}: its model_type and sizes, as transformers "
            "saves it",
        )


def load_model(path: str) -> ModelGeometry:
    """The model at *path* (a folder with config.json, or the file) as transformers builds it."""
    check_model_config(path)
    doc = run_worker("iotune.workers.model_meta", str(Path(path).resolve()), "reading the model")
    if "error" in doc:
        raise PresetError(doc["error"], hint=doc.get("hint"))
    if not doc["tensors"]:
        raise PresetError(f"{path}: the model has no parameters", hint="check its config.json")
    return geometry_of(doc, str(path))


def geometry_of(doc: dict[str, Any], source: str) -> ModelGeometry:
    """A model as iotune.workers.model_meta describes it (built from its config.json), or as
    a traced run's own processes did (iotune/hook/sitecustomize.py): the same fields."""
    return ModelGeometry(
        hidden_size=doc["hidden_size"],
        intermediate_size=doc["intermediate_size"],
        num_hidden_layers=doc["num_hidden_layers"],
        num_attention_heads=doc["num_attention_heads"],
        num_key_value_heads=doc["num_key_value_heads"],
        tie_word_embeddings=bool(doc["tied"]),
        vocab_size=doc["vocab_size"],
        max_position_embeddings=doc["max_position_embeddings"] or DEFAULT_SEQ_LEN,
        source=source,
        architecture=doc["architecture"],
        type_name=doc["model_type"] or "custom",
        config=doc["config"],
        params=tuple((str(t[0]), int(t[1])) for t in doc["tensors"]),
        tied=tuple((str(t[0]), int(t[1])) for t in doc["tied"]),
    )


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
    geometry: ModelGeometry | None = None,
    name: str | None = None,
) -> Preset:
    """A preset for the user's model and config; the flags win over the config's values.
    With *geometry* (a traced run's own model, iotune.train.observe), *model* names it and
    nothing is read from a model folder."""
    overrides = parse_sets(sets)
    if steps is not None:
        overrides["steps"] = steps
    # what can be refused without DeepSpeed or transformers is, before their workers start
    if geometry is None:
        check_model_config(model)
    for key, value in overrides.items():
        if key.startswith("ds."):
            check_ds_value(key, value)
    dtype = overrides.get("dtype")
    if ranks is None and geometry is None and not ds_config_path.endswith(".json"):
        from iotune.model.accel import launch_processes

        # accelerate's YAML says how many processes it launches: the ranks, unless --ranks
        ranks = launch_processes(ds_config_path)
    cfg, notes, filled = read_ds_config(
        ds_config_path,
        {
            "model": model,
            "micro_batch": micro_batch,
            "ga": ga,
            "ranks": max(1, ranks or 1),
            "dtype": None if dtype is None else str(dtype),
            "steps": int(overrides.get("steps", 5)),
        }
        if geometry is None
        else None,
    )
    if geometry is None:
        geometry = load_model(model)
    s = strategy_of(cfg, ds_config_path)
    if not ds_config_path.endswith(".json"):
        from iotune.model.accel import accelerate_doc

        if accelerate_doc(ds_config_path) is not None:
            s = replace(s, about=f"accelerate's config {ds_config_path}, as it gives DeepSpeed")
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
    p = Preset(
        name=name or f"{Path(model).resolve().name}+{Path(ds_config_path).stem}",
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
        ds_notes=tuple(notes),
        ds_filled=tuple(filled),
    )
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
    from iotune.model.presets import preset_with

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
