"""The records' encoding of a trace's samples, side by side in one run: iotune's
``to_jsonable`` (plain values, lists and dicts taken by their exact type first) against the
general path alone (every value through the dataclass, enum, path, mapping and sequence
checks, as it was before), on the sample records of a real trace.

    .venv/bin/python benchmarks/record_encode.py RUN_DIR [--rounds 7]

RUN_DIR: a folder ``iotune trace --run ... --out RUN_DIR`` wrote (its ``samples.jsonl``). Each
round encodes every record both ways, in alternating order; the script prints the CPU
milliseconds per record of each and the median of the ratios. Both ways give the same
values (tests/unit/test_records.py holds them to it); the tracing process encodes one
record per sample, a second's worth of counters and histograms for each drive, which on an
emulated CPU (thirty times slower) was a fifth of its own CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from iotune.records import read_records, to_jsonable


def general(obj: Any) -> Any:
    """Every value through the general checks, in to_jsonable's order."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: general(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): general(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | frozenset | set):
        return [general(v) for v in obj]
    return obj


def per_record_ms(fn: Any, records: list[dict[str, Any]]) -> float:
    t0 = time.process_time()
    for r in records:
        fn(r)
    return 1000 * (time.process_time() - t0) / len(records)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    records = list(read_records(args.run_dir / "samples.jsonl"))
    if not records:
        raise SystemExit(f"no sample records in {args.run_dir / 'samples.jsonl'}")
    if any(json.dumps(to_jsonable(r)) != json.dumps(general(r)) for r in records):
        raise SystemExit("the two ways encode a record differently")
    size = statistics.median(len(json.dumps(r)) for r in records)
    print(f"{len(records)} sample records, median {size:,.0f} bytes of JSON each")
    ratios = []
    for i in range(args.rounds):
        order = [("general", general), ("to_jsonable", to_jsonable)]
        if i % 2:
            order.reverse()
        ms = {name: per_record_ms(fn, records) for name, fn in order}
        ratios.append(ms["general"] / ms["to_jsonable"])
        print(
            f"round {i + 1}: general {ms['general']:.3f} ms, to_jsonable "
            f"{ms['to_jsonable']:.3f} ms a record ({ratios[-1]:.1f}x)"
        )
    print(f"median: to_jsonable {statistics.median(ratios):.1f}x faster than the general path")


if __name__ == "__main__":
    main()
