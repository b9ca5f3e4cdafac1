"""The seed study's published figures (configs/study.toml), to print beside iotune's estimate
and measurements of the matching preset. Pure: reading one TOML file."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iotune.model.presets import Preset, PresetError
from iotune.paths import data_dir
from iotune.units import GIB


@dataclass(frozen=True)
class StudyRow:
    case: str
    strategy: str
    params: float  # the study's implied N
    space_gib: float | None = None
    read_gib: float | None = None
    write_gib: float | None = None
    step_s: float | None = None
    optimizer_s: float | None = None
    read_focus: int | None = None
    write_focus: int | None = None
    read_other: int | None = None
    write_other: int | None = None

    def per_n(self, gib: float | None) -> float | None:
        """A GiB figure as bytes per parameter of the study's model (16.0 for 16N)."""
        return None if gib is None else gib * GIB / self.params


def load_study(path: Path | None = None) -> dict[str, Any]:
    p = path or data_dir("configs") / "study.toml"
    try:
        with p.open("rb") as fh:
            return dict(tomllib.load(fh)["study"])
    except (OSError, tomllib.TOMLDecodeError, KeyError) as exc:
        raise PresetError(
            f"cannot read the study's figures from {p}: {exc}", hint="reinstall iotune"
        ) from exc


def study_row(preset: Preset, path: Path | None = None) -> StudyRow | None:
    """The study's row for this preset's strategy at the study's size (accumulation 1)."""
    doc = load_study(path)
    if preset.size != doc["size"] or preset.ga != 1:
        return None
    for row in doc.get("table", []):
        if row["strategy"] == preset.strategy.name:
            return StudyRow(params=float(doc["params"]), **row)
    return None
