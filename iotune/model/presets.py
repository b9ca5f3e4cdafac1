"""Training presets (configs/presets.toml): model geometry (iotune.model.geometry), strategy,
and the DeepSpeed config each one runs with; the --set overrides on them, checked (the
DeepSpeed keys' bounds are iotune.model.dsbounds), and the dtype a preset computes in. Pure:
no torch, no DeepSpeed, no I/O beyond reading the TOML file."""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from iotune.errors import UsageError
from iotune.model.dsbounds import DS_BOUNDS
from iotune.model.geometry import LLAMA31, Geometry, ModelGeometry
from iotune.paths import data_dir
from iotune.probes.cpu import Bf16Support, bf16_support


class PresetError(UsageError):
    """A preset, or a --set override, that cannot be run as asked."""


@dataclass(frozen=True)
class Strategy:
    name: str
    about: str
    stage: int
    optimizer: str  # gpu | cpu | nvme: where the fp32 master and Adam state live
    params: str  # gpu | nvme: where the bf16 parameters live between uses
    raid: bool = False
    zenflow: bool = False
    gradient_checkpointing: bool = True
    zero_init: bool = True  # the model is built inside deepspeed.zero.Init (stage 3)

    @property
    def uses_nvme(self) -> bool:
        return "nvme" in (self.optimizer, self.params)


@dataclass(frozen=True)
class Preset:
    name: str
    size: str
    geometry: Geometry
    strategy: Strategy
    ga: int
    micro_batch: int
    seq_len: int
    steps: int
    accelerator: str  # cuda | cpu
    nvme_path: str | None
    deepspeed: dict[str, Any]  # the [deepspeed] base, with aio and zenflow blocks
    # or, for --ds-config, the user's whole DeepSpeed config, run as it is (ds_user)
    ds_set: dict[str, Any] = field(default_factory=dict)  # "ds.a.b" overrides, dotted
    seed: int = 0
    cpu_threads: int | None = None
    gradient_checkpointing: bool = True
    ranks: int = 1  # training processes on each node (one per GPU), DeepSpeed's launcher
    nodes: int = 1  # nodes (a DeepSpeed hostfile's hosts)
    dtype: str = "auto"  # auto | bf16 | fp32: the model's (forward/backward) dtype
    ds_user: bool = False  # deepspeed is a user's config (--ds-config), not a preset's base
    #: what reading a user's config said of it: (setting, text) of the keys DeepSpeed
    #: ignores, shown as advice; and the "auto" values filled: (key, value, from what)
    ds_notes: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    ds_filled: tuple[tuple[str, str, str], ...] = field(default=(), compare=False)

    @property
    def world(self) -> int:
        """Data-parallel ranks: ZeRO-3 partitions every tensor over them."""
        return self.ranks * self.nodes

    @property
    def zero_init(self) -> bool:
        return self.strategy.zero_init and self.strategy.stage == 3

    @property
    def aio(self) -> dict[str, Any]:
        return dict(self.deepspeed.get("aio", {}))

    @property
    def tokens_per_step(self) -> int:
        return self.ga * self.micro_batch * self.seq_len


# ----------------------------------------------------------------------------- loading


def _load(path: Path | None = None) -> dict[str, Any]:
    p = path or data_dir("configs") / "presets.toml"
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise PresetError(f"no preset file at {p}", hint="reinstall iotune") from exc
    except tomllib.TOMLDecodeError as exc:
        raise PresetError(f"{p}: {exc}", hint="fix the TOML syntax") from exc


def _geometry(table: dict[str, Any]) -> Geometry:
    return Geometry(**{**LLAMA31, **table})


def _strategy(name: str, table: dict[str, Any]) -> Strategy:
    return Strategy(name=name, **table)


def load_presets(path: Path | None = None) -> dict[str, Preset]:
    """Every preset: the study's grid (strategy x size x accumulation) and the hand-made ones."""
    doc = _load(path)
    grid = doc["grid"]
    sizes = {k: _geometry(v) for k, v in doc["sizes"].items()}
    strategies = {k: _strategy(k, v) for k, v in doc["strategies"].items()}
    base = doc.get("deepspeed", {})
    out: dict[str, Preset] = {}
    for sname, strat in strategies.items():
        for size in grid["sizes"]:
            for ga in grid["accumulation"]:
                name = f"{sname}_{size}" + ("" if ga == 1 else f"_ga{ga}")
                out[name] = Preset(
                    name=name,
                    size=size,
                    geometry=sizes[size],
                    strategy=strat,
                    ga=int(ga),
                    micro_batch=int(grid["micro_batch"]),
                    seq_len=int(grid["seq_len"]),
                    steps=int(grid["steps"]),
                    accelerator=str(grid["accelerator"]),
                    nvme_path=(grid["raid_path"] if strat.raid else grid["nvme_path"])
                    if strat.uses_nvme
                    else None,
                    deepspeed=base,
                    gradient_checkpointing=strat.gradient_checkpointing,
                )
    for name, t in doc.get("preset", {}).items():
        strat = strategies[t["strategy"]]
        p = Preset(
            name=name,
            size=t["size"],
            geometry=sizes[t["size"]],
            strategy=strat,
            ga=int(t.get("ga", 1)),
            micro_batch=int(t.get("micro_batch", grid["micro_batch"])),
            seq_len=int(t.get("seq_len", grid["seq_len"])),
            steps=int(t.get("steps", grid["steps"])),
            accelerator=str(t.get("accelerator", grid["accelerator"])),
            nvme_path=t.get("nvme_path") if strat.uses_nvme else None,
            deepspeed=base,
            gradient_checkpointing=strat.gradient_checkpointing,
        )
        out[name] = apply_sets(p, dict(t.get("set", {})))
    return out


def get_preset(name: str, path: Path | None = None) -> Preset:
    presets = load_presets(path)
    if name not in presets:
        close = [n for n in presets if n.startswith(name.split("_", maxsplit=1)[0])][:6]
        raise PresetError(
            f"no preset named {name!r}",
            hint="'iotune presets list' shows them all"
            + (f"; e.g. {', '.join(close)}" if close else ""),
        )
    return presets[name]


# ----------------------------------------------------------------------------- overrides

_FIELDS = {
    "steps": int,
    "ga": int,
    "micro_batch": int,
    "seq_len": int,
    "seed": int,
    "cpu_threads": int,
    "accelerator": str,
    "nvme_path": str,
    "gradient_checkpointing": bool,
    "ranks": int,
    "nodes": int,
    "dtype": str,
}


def preset_with(name: str, sets: tuple[str, ...], steps: int | None = None) -> Preset:
    """The preset called *name* with the --set overrides and --steps applied."""
    preset = get_preset(name)
    overrides = parse_sets(sets)
    if steps is not None:
        overrides["steps"] = steps
    return apply_sets(preset, overrides)


def parse_value(text: str) -> Any:
    """JSON when it parses (numbers, true/false, lists, objects), else the plain string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_sets(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PresetError(
                f"--set {item!r} is not key=value",
                hint="e.g. --set steps=10 --set ds.aio.queue_depth=32 --set model.num_hidden_layers=8",
            )
        out[key.strip()] = parse_value(value.strip())
    return out


def apply_sets(preset: Preset, sets: dict[str, Any]) -> Preset:
    """Apply overrides: a preset field (steps, ga, seq_len...), model.FIELD, or ds.a.b.c."""
    changes: dict[str, Any] = {}
    geo: dict[str, Any] = {}
    ds = dict(preset.ds_set)
    for key, value in sets.items():
        if key.startswith("ds."):
            if key in _DS_OWNED:
                raise PresetError(
                    f"{key} is set from the preset", hint=f"use --set {_DS_OWNED[key]}=N instead"
                )
            ds[key] = check_ds_value(key, value)
        elif key.startswith("model.") and isinstance(preset.geometry, ModelGeometry):
            raise PresetError(
                f"--set {key}: the model is {preset.geometry.source}",
                hint="edit a copy of its config.json and pass that folder to --model",
            )
        elif key.startswith("model."):
            k = key.removeprefix("model.")
            if k not in {f.name for f in fields(Geometry)}:
                raise PresetError(
                    f"unknown model field {k!r}",
                    hint="fields: " + ", ".join(f.name for f in fields(Geometry)),
                )
            geo[k] = value
        elif key in _FIELDS:
            want = _FIELDS[key]
            least = 0 if key == "seed" else 1
            if want is int and (
                isinstance(value, bool) or not isinstance(value, int) or value < least
            ):
                raise PresetError(
                    f"{key} must be a positive integer, got {value!r}", hint=f"--set {key}=4"
                )
            if want is bool and not isinstance(value, bool):
                raise PresetError(
                    f"{key} must be true or false, got {value!r}", hint=f"--set {key}=true"
                )
            changes[key] = str(value) if want is str else value
        else:
            raise PresetError(
                f"unknown setting {key!r}",
                hint="preset fields: "
                + ", ".join(_FIELDS)
                + "; model.FIELD for the geometry; ds.a.b for the DeepSpeed config",
            )
    if "dtype" in changes and changes["dtype"] not in DTYPES:
        raise PresetError(
            f"dtype must be {', '.join(DTYPES)}, got {changes['dtype']!r}",
            hint="--set dtype=fp32 (auto: bf16 on a GPU and on a CPU that computes it natively)",
        )
    if "accelerator" in changes and changes["accelerator"] not in ("cuda", "cpu"):
        raise PresetError(
            f"accelerator must be cuda or cpu, got {changes['accelerator']!r}",
            hint="--set accelerator=cpu",
        )
    if geo:
        changes["geometry"] = check_geometry(replace(preset.geometry, **geo))
    return replace(preset, ds_set=ds, **changes)


def check_ds_value(key: str, value: Any) -> Any:
    """A --set ds.KEY value as DeepSpeed is given it: refused in one line naming the key where
    DeepSpeed would refuse it or fail on it (a negative size or count, zero where one is
    needed); a section given whole (a JSON object) is checked key by key."""
    dotted = key.removeprefix("ds.")
    if isinstance(value, dict):
        return {k: check_ds_value(f"{key}.{k}", v) for k, v in value.items()}
    bound = DS_BOUNDS.get(dotted)
    if bound is None:
        return value
    took = bound.takes(value)
    if took is None:
        raise PresetError(
            f"{key} must be {bound.says()}, got {value!r}",
            hint=f"e.g. --set {key}={bound.example}",
        )
    return took


#: DeepSpeed keys a preset field owns: setting them under ds. would desynchronise the table
_DS_OWNED = {
    "ds.gradient_accumulation_steps": "ga",
    "ds.train_micro_batch_size_per_gpu": "micro_batch",
    "ds.bf16.enabled": "dtype",
}

#: the model dtypes a preset can train in (--set dtype=...)
DTYPES = ("auto", "bf16", "fp32")


@dataclass(frozen=True)
class Dtype:
    """The dtype a preset's model computes in, and why."""

    name: str  # bf16 | fp32
    why: str
    native_bf16: bool | None = None  # a CPU run: what the host's CPU does (None: not asked)
    cpu: dict[str, Any] | None = None  # a CPU run: the flags behind that answer

    @property
    def element_size(self) -> int:
        return 2 if self.name == "bf16" else 4

    @property
    def emulated_bf16(self) -> bool:
        """bf16 on a CPU that emulates it: a user forced it (about 50x slower)."""
        return self.name == "bf16" and self.native_bf16 is False


def resolve_dtype(preset: Preset, bf16: Bf16Support | None = None) -> Dtype:
    """auto is bf16 on a GPU and on a CPU with native bf16 (AVX-512 BF16, AMX, Arm BF16),
    float32 on any other CPU: there bf16 is emulated about 50x slower, and float32 swaps the
    same optimizer state (DeepSpeed keeps the fp32 master and Adam moments whatever the model
    dtype). *bf16* is the host's answer (probed here when not given)."""
    said = (
        "your DeepSpeed config's bf16.enabled (or --set dtype)"
        if preset.ds_user
        else f"--set dtype={preset.dtype}"
    )
    if preset.accelerator != "cpu":
        if preset.dtype in ("fp32", "bf16"):
            return Dtype(preset.dtype, f"set with {said}")
        return Dtype("bf16", "a GPU computes bf16 natively")
    bf16 = bf16 or bf16_support()
    facts = bf16.to_dict()
    if preset.dtype == "auto":
        if bf16.native:
            return Dtype("bf16", f"this CPU computes bf16 natively: {bf16.why}", True, facts)
        return Dtype(
            "fp32",
            f"bf16 would be {bf16.why}; float32 runs at native speed and swaps the same "
            "optimizer state",
            False,
            facts,
        )
    return Dtype(
        preset.dtype,
        f"set with {said}; bf16 here is {bf16.why}",
        bf16.native,
        facts,
    )


def check_geometry(g: Geometry) -> Geometry:
    """A LlamaConfig the model can be built from: positive sizes that divide evenly."""
    for f in fields(Geometry):
        v = getattr(g, f.name)
        if f.type in ("int", int) and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise PresetError(
                f"model.{f.name} must be a positive integer, got {v!r}",
                hint="e.g. --set model.num_hidden_layers=8",
            )
        if f.type in ("float", float) and (
            isinstance(v, bool) or not isinstance(v, int | float) or v <= 0
        ):
            raise PresetError(
                f"model.{f.name} must be a positive number, got {v!r}", hint="e.g. 500000.0"
            )
        if f.type in ("bool", bool) and not isinstance(v, bool):
            raise PresetError(f"model.{f.name} must be true or false, got {v!r}", hint="e.g. true")
    if g.hidden_size % g.num_attention_heads:
        raise PresetError(
            f"hidden_size {g.hidden_size} does not divide by num_attention_heads {g.num_attention_heads}",
            hint="pick sizes that divide evenly",
        )
    if g.num_attention_heads % g.num_key_value_heads:
        raise PresetError(
            f"num_attention_heads {g.num_attention_heads} does not divide by num_key_value_heads "
            f"{g.num_key_value_heads}",
            hint="pick sizes that divide evenly",
        )
    return g


def base_name(name: str) -> str:
    """The preset a grid name was made from: opt_nvme_1b_ga4 -> opt_nvme_1b."""
    head, _, tail = name.rpartition("_ga")
    return head if head and tail.isdigit() else name
