"""Flat records in JSON-lines files: every measurement is one self-describing line."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import platform
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums, paths, tuples and mappings → plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | frozenset | set):
        return [to_jsonable(v) for v in obj]
    return obj


def dumps(obj: Any, *, indent: int | None = 2) -> str:
    return json.dumps(to_jsonable(obj), indent=indent, sort_keys=False)


def append_record(path: Path, record: Mapping[str, Any]) -> None:
    """Append one record and fsync, so an interrupted run keeps every finished record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(to_jsonable(record), sort_keys=True) + "\n"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete record of *path*; a torn last line (a kill mid-write) is ignored."""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                break
            if line.strip():
                yield json.loads(line)


def host_facts() -> dict[str, Any]:
    """Facts stored beside every measurement so records from different hosts can be compared."""
    from iotune.probes.cpu import bf16_support

    uname = platform.uname()
    return {
        "host": socket.gethostname(),
        "kernel": uname.release,
        "machine": uname.machine,
        "cpus": os.cpu_count(),
        "bf16": bf16_support().why,  # CPU timings differ ~50x with emulated bf16
        "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
