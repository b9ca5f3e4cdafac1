"""A finished (or interrupted) ``sweep-aio`` run read back: the one reader of its
``points.jsonl`` and ``sweep.json`` that every consumer uses (the predictions, the advice, the
planner, the report). The points that succeeded, the target swept, the best point per op and
a configuration's bandwidth, each by the sweep's own rule (:mod:`iotune.sweep.space`: a
configuration's median over every measurement of it), so a point marked failed never counts
anywhere."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iotune.errors import UsageError
from iotune.records import read_records, swap_rehearsals
from iotune.sweep import space as sp

POINTS = "points.jsonl"
SPEC = "sweep.json"
FIO = "fio.jsonl"

Config = tuple[int, int, int, bool, bool]


def run_dir(path: Path) -> Path:
    """The run directory named by *path*: the folder, or the folder of a file in it."""
    return path if path.is_dir() else path.parent


def has_points(path: str | Path | None) -> bool:
    """Whether *path* names a sweep with measurements (not just a DeepSpeed config)."""
    return bool(path) and (run_dir(Path(str(path))) / POINTS).exists()


@dataclass(frozen=True)
class SweepRun:
    dir: Path
    points: tuple[dict[str, Any], ...]  # every record, failed ones too
    spec: dict[str, Any]  # sweep.json's document ({} where it is missing)

    @classmethod
    def load(cls, path: Path) -> SweepRun:
        d = run_dir(path)
        f = d / POINTS
        if not f.exists():
            raise UsageError(
                f"{path} is not a sweep-aio run directory (no {POINTS})",
                hint="run 'iotune sweep-aio --target DIR --out RUN' on the offload drive, "
                "then pass RUN",
            )
        try:
            spec = json.loads((d / SPEC).read_text())
        except (OSError, ValueError):
            spec = {}
        return cls(d, tuple(read_records(f)), spec if isinstance(spec, dict) else {})

    @property
    def points_file(self) -> Path:
        return self.dir / POINTS

    @property
    def ok(self) -> list[dict[str, Any]]:
        """The points that succeeded."""
        return [r for r in self.points if r.get("status") == "ok"]

    @property
    def target(self) -> str | None:
        """The path the sweep measured, as it was given."""
        t = (self.spec.get("spec") or {}).get("target")
        return str(t) if t else None

    def by_config(self) -> dict[str, dict[Config, list[dict[str, Any]]]]:
        return sp.by_config(self.ok)

    def best_per_op(self) -> dict[str, dict[str, Any]]:
        """Per op, the best configuration by its median over every measurement."""
        return sp.best_per_op(self.ok)

    def bandwidth_at(self, op: str, config: Config) -> float | None:
        """The configuration's bandwidth for *op*, the median of every measurement of it."""
        recs = self.by_config().get(op, {}).get(config)
        return sp.pooled(recs) if recs else None

    def ceilings(self) -> list[dict[str, Any]]:
        """fio's measurements over the same grid, where the sweep took them."""
        f = self.dir / FIO
        return list(read_records(f)) if f.exists() else []

    def rehearsals(self) -> list[dict[str, Any]]:
        """Its rehearsals of a run's optimizer swapping (``--swap-pattern``) that succeeded."""
        return [r for r in swap_rehearsals(self.dir) if r.get("status") == "ok"]
