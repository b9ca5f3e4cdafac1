"""accelerate's config file (YAML, as `accelerate config` writes it) given as --ds-config: the
DeepSpeed config `accelerate launch --config_file FILE` hands DeepSpeed, made by
accelerate's own loader, launcher and DeepSpeedPlugin in a worker
(iotune.workers.accel_config), its "auto" values filled as ``Accelerator.prepare`` fills
them."""

from __future__ import annotations

import importlib
import json
import tempfile
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.errors import CommandFailed
from iotune.model.presets import PresetError

#: keys only an accelerate config file has at its top level
ACCELERATE_KEYS = ("distributed_type", "deepspeed_config", "compute_environment")


def accelerate_doc(path: str) -> dict[str, Any] | None:
    """The file as a YAML mapping where it is an accelerate config, else None (and None
    where PyYAML, which accelerate brings, is not installed)."""
    try:
        yaml: Any = importlib.import_module("yaml")  # PyYAML, which accelerate brings
    except ImportError:
        return None
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if isinstance(doc, dict) and any(k in doc for k in ACCELERATE_KEYS):
        return doc
    return None


def launch_processes(path: str) -> int | None:
    """The processes `accelerate launch` starts from the file (its num_processes), or None
    where it does not say or is not an accelerate config."""
    doc = accelerate_doc(path)
    n = doc.get("num_processes") if doc else None
    return n if isinstance(n, int) and n > 0 else None


def read_accelerate_config(
    path: str, fill: dict[str, Any] | None
) -> tuple[dict[str, Any], list[tuple[str, str]], list[tuple[str, str, str]]]:
    """The DeepSpeed config accelerate gives DeepSpeed for the file at *path*, the notes on
    it (a launcher field accelerate does not pass on), and (key, value, from what) for each
    "auto" filled; one line where accelerate refuses the file."""
    fill = fill or {}
    req = {
        "path": str(Path(path).resolve()),
        "micro_batch": fill.get("micro_batch"),
        "ga": fill.get("ga"),
        "ranks": fill.get("ranks"),
        "model": str(Path(fill["model"]).resolve()) if fill.get("model") else None,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:
        json.dump(req, fh)
        fh.flush()
        try:
            doc = proc.run_worker("iotune.workers.accel_config", fh.name, timeout=600)
        except CommandFailed as exc:
            raise PresetError(
                f"reading {path} with accelerate failed: {exc.message}",
                hint="'iotune doctor --for train' shows whether accelerate imports",
            ) from exc
    if "error" in doc:
        raise PresetError(doc["error"], hint=doc.get("hint"))
    filled = [(str(k), json.dumps(v), str(why)) for k, v, why in doc["filled"]]
    notes = [(str(k), str(text)) for k, text in doc["notes"]]
    return doc["config"], notes, filled
