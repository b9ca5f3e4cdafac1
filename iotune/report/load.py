"""What a report is made of, found in any mix of directories: a study (study.json +
runs.jsonl), a run (run.json), a run document (the JSON `iotune --json run` prints), a
sweep-aio run (points.jsonl), a sweep-threads run (threads.json), or a directory holding
any of these one level down."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iotune.errors import UsageError
from iotune.records import read_records, read_threads
from iotune.study import record as rec
from iotune.sweep.run import SweepRun, has_points


@dataclass
class AioSweep:
    name: str
    records: list[dict[str, Any]]  # points.jsonl, status ok
    ceilings: list[dict[str, Any]]  # fio.jsonl
    target: str | None


@dataclass
class ReportData:
    runs: list[dict[str, Any]] = field(default_factory=list)  # study records
    sweeps: list[AioSweep] = field(default_factory=list)
    threads: list[dict[str, Any]] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.runs or self.sweeps or self.threads)


def _json(f: Path) -> Any:
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError):
        return None


def _study(d: Path, data: ReportData) -> None:
    f = d / "runs.jsonl"
    if f.exists():
        data.runs.extend(read_records(f))
    data.sources.append(f"study {d}")


def _sweep(d: Path, data: ReportData) -> None:
    run = SweepRun.load(d)
    data.sweeps.append(
        AioSweep(name=d.name, records=run.ok, ceilings=run.ceilings(), target=run.target)
    )
    data.sources.append(f"sweep-aio {d}")


def _one(p: Path, data: ReportData) -> bool:
    """Load *p* if it is something a report is made of; False if it is not."""
    if p.is_file():
        doc = _json(p) if p.suffix == ".json" else None
        if isinstance(doc, dict) and "preset" in doc and "table" in doc:
            data.runs.append(rec.summarize_run(doc, None, str(p)))
            data.sources.append(f"run {p}")
            return True
        threads = read_threads(p)
        if threads is not None:
            data.threads.append({**threads, "source": str(p)})
            data.sources.append(f"sweep-threads {p}")
            return True
        return False
    if (p / "study.json").exists():
        _study(p, data)
    elif (p / "run.json").exists():
        data.runs.append(rec.load_run_dir(p))
        data.sources.append(f"run {p}")
    elif has_points(p):
        _sweep(p, data)
    elif (p / "threads.json").exists():
        return _one(p / "threads.json", data)
    else:
        return False
    return True


def load(paths: list[Path]) -> ReportData:
    data = ReportData()
    for p in paths:
        if not p.exists():
            raise UsageError(f"{p}: no such file or directory", hint="name a study, run or sweep")
        if _one(p, data):
            continue
        found = p.is_dir() and any([_one(c, data) for c in sorted(p.iterdir())])
        if not found:
            raise UsageError(
                f"{p} holds no study, run or sweep",
                hint="name what 'iotune study', 'iotune run', 'iotune sweep-aio' or "
                "'iotune sweep-threads' wrote (their --out directories)",
            )
    return data
