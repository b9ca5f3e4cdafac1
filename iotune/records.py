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

from iotune.errors import UsageError

#: files of a run directory that more than one command reads (sweep-aio writes the first,
#: sweep-threads the second; estimate, run and study predict from them)
SWEEP_RESULT = "result.json"
SWAP_REHEARSALS = "swap.jsonl"
THREADS_RESULT = "threads.json"
#: the kinds of a prediction's terms that wait on the drives (iotune.plan.predict.Term)
DRIVE_KINDS = frozenset({"read", "write", "gradients", "parameters"})


#: values JSON takes as they are, by exact type (a subclass, an IntEnum say, takes the long way)
_PLAIN = frozenset({str, int, float, bool, type(None)})


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums, paths, tuples and mappings → plain JSON values. Plain values, lists
    and dicts by their exact type first: a trace's samples are long lists of counters, and
    the checks below (a Mapping's among them, an abstract class's) cost each of them more
    than the JSON encoding."""
    kind = type(obj)
    if kind in _PLAIN:
        return obj
    if kind is list or kind is tuple:
        return [v if type(v) in _PLAIN else to_jsonable(v) for v in obj]
    if kind is dict:
        return {str(k): v if type(v) in _PLAIN else to_jsonable(v) for k, v in obj.items()}
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


def append_record(path: Path, record: Mapping[str, Any], sync: bool = True) -> None:
    """Append one record and fsync, so an interrupted run keeps every finished record.
    ``sync=False`` leaves it in the page cache: a killed process keeps it all the same, a
    crash of the machine may lose it, until the next synced record of the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(to_jsonable(record), sort_keys=True) + "\n"
    with path.open("a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        if sync:
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


def swap_rehearsals(run_dir: Path) -> list[dict[str, Any]]:
    """A sweep's rehearsals of DeepSpeed's optimizer swapping (``sweep-aio --swap-pattern``)."""
    f = run_dir / SWAP_REHEARSALS
    return list(read_records(f)) if f.exists() else []


def load_aio(path: str | None) -> tuple[dict[str, Any] | None, str]:
    """--aio-config: a `sweep-aio` run directory, its result.json, or a DeepSpeed config.

    Returns the aio block and where it came from ("preset" when no path is given)."""
    if path is None:
        return None, "preset"
    p = Path(path)
    f = p / SWEEP_RESULT if p.is_dir() else p
    try:
        doc = json.loads(f.read_text())
    except FileNotFoundError as exc:
        raise UsageError(
            f"--aio-config {path}: "
            + (
                f"a folder, but no sweep-aio run (it has no {SWEEP_RESULT})"
                if p.is_dir()
                else "no such file"
            ),
            hint="name a sweep-aio run directory or a DeepSpeed JSON config",
        ) from exc
    except IsADirectoryError as exc:
        raise UsageError(
            f"--aio-config {f} is a folder, not a config",
            hint="name a sweep-aio run directory or a DeepSpeed JSON config",
        ) from exc
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"--aio-config {f}: not JSON ({exc.msg})", hint="name a DeepSpeed JSON config"
        ) from exc
    aio = doc.get("aio") if isinstance(doc, dict) else None
    if not isinstance(aio, dict) or not isinstance(aio.get("block_size"), int):
        raise UsageError(
            f'--aio-config {f} has no "aio" block with a block_size',
            hint="a finished 'iotune sweep-aio' run directory, or a config written by --write-config",
        )
    return aio, str(f)


def read_threads(path: Path) -> dict[str, Any] | None:
    """A `sweep-threads` result (its directory, or its threads.json): the one reader of that
    file. None where *path* holds none (or not one of its documents)."""
    f = path / THREADS_RESULT if path.is_dir() else path
    try:
        doc = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(doc, dict) and isinstance(doc.get("rows"), list) and "best_threads" in doc
    return doc if ok else None


def threads_memory(path: Path) -> tuple[float, str] | None:
    """The host's memory bandwidth a sweep-threads run measured (its best triad, bytes/s)
    and where it comes from; None where it did not measure it."""
    doc = read_threads(path)
    best = ((doc or {}).get("memory") or {}).get("best")
    if not isinstance(best, dict) or not best.get("triad_bytes_s"):
        return None
    f = path / THREADS_RESULT if path.is_dir() else path
    return float(best["triad_bytes_s"]), f"{f}: STREAM triad at {best['threads']} thread(s)"
