"""Merging the recommended "aio" block into a DeepSpeed config, checked by DeepSpeed itself."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.errors import IotuneError, UsageError


def merge_aio(existing: dict[str, Any], aio: dict[str, Any]) -> dict[str, Any]:
    """A copy of *existing* with its "aio" section replaced; everything else is kept."""
    merged: dict[str, Any] = json.loads(json.dumps(existing))
    merged["aio"] = dict(aio)
    return merged


def validate(cfg: dict[str, Any]) -> dict[str, Any]:
    """Run DeepSpeed's own config readers on *cfg* in a worker process."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(cfg, fh)
        name = fh.name
    try:
        return proc.run_worker("iotune.workers.ds_config_check", name, timeout=300)
    finally:
        Path(name).unlink(missing_ok=True)


def read_config(path: Path) -> dict[str, Any]:
    """The DeepSpeed config at *path* to merge into ({} where there is none yet)."""
    existing: dict[str, Any] = {}
    if path.exists():
        try:
            existing = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{path} is not valid JSON: {exc}", hint="fix it, or name a new file"
            ) from exc
        if not isinstance(existing, dict):
            raise UsageError(
                f"{path} does not hold a JSON object", hint="a DeepSpeed config is an object"
            )
    return existing


def write_config(path: Path, aio: dict[str, Any]) -> dict[str, Any]:
    return write_merged(path, merge_aio(read_config(path), aio), aio)


def write_merged(
    path: Path, merged: dict[str, Any], aio: dict[str, Any] | None = None
) -> dict[str, Any]:
    """*merged* into *path* (a whole new file, in one rename) once DeepSpeed's own readers
    take it, and read *aio* as it is where one is given; DeepSpeed's report."""
    report = validate(merged)
    if report["errors"]:
        raise IotuneError(
            f"DeepSpeed rejects the merged config: {'; '.join(report['errors'])}",
            hint=f"{path} was not changed",
        )
    if aio is not None and report.get("aio_used") != aio:
        raise IotuneError(
            f"DeepSpeed would read aio as {report.get('aio_used')}, not {aio}",
            hint=f"{path} was not changed",
        )
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(merged, indent=2) + "\n")
    tmp.replace(path)
    return report
