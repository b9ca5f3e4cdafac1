"""A user's model and DeepSpeed config as a preset (--model, --ds-config): the model's real
parameter tensors (built on the meta device by iotune.workers.model_meta), the config read
as DeepSpeed reads it (iotune.workers.ds_config_check), and the batch geometry from the
flags, the config, or the defaults, in that order. Everything the presets feed (estimate,
run, trace, study, the planner) then works on it unchanged."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.errors import CommandFailed
from iotune.model.presets import (
    ModelGeometry,
    Preset,
    PresetError,
    Strategy,
    apply_sets,
    check_ds_value,
    parse_sets,
)

#: the sequence length where neither --seq-len nor the model says one
DEFAULT_SEQ_LEN = 2048


def _worker(module: str, arg: str, what: str) -> dict[str, Any]:
    try:
        return proc.run_worker(module, arg, timeout=600)
    except CommandFailed as exc:
        raise PresetError(
            f"{what} failed: {exc.message}",
            hint="'iotune doctor --for train' shows whether torch and transformers import",
        ) from exc


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
    doc = _worker("iotune.workers.model_meta", str(Path(path).resolve()), "reading the model")
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
        doc = _worker("iotune.workers.ds_auto", fh.name, 'filling the config\'s "auto" values')
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
        report = _worker("iotune.workers.ds_config_check", fh.name, "checking the DeepSpeed config")
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
