"""``sweep-checkpoint --copy-from``: the copy a save makes of NVMe-offloaded optimizer state,
swept against its ceiling between the offload volume and the checkpoint volume.

A swap folder as DeepSpeed leaves it for the state of ``--params`` parameters (the fp32
master and Adam's two moments of each sub-group, 12 bytes a parameter) is written O_DIRECT on
the offload volume, then copied into the checkpoint folder, each copy in a worker of its
own, the page cache dropped before each (iotune.workers.copy_point):

- ``ceiling``: the raw O_DIRECT copy through the aio op, each chunk's read and write in
  flight at once, the best of its settings (iotune.workers.copyrate.ceiling);
- ``deepspeed``: ``shutil.copytree``, as DeepSpeed's save makes it, then made durable;
- ``reflink``: each file cloned, where the checkpoint folder's file system clones and holds
  the swap folder;
- ``aio``: iotune's copy (``--checkpoint-copy aio``) at each block size, queue depth and
  thread count asked.

Every point once a round, the order turned each round (these hosts' disks drift: a point and
its ceiling are compared within a round); each copy kept in ``RUN/copy_points.jsonl`` as it
ends. The result: each point's median, the best aio copy's rate against the ceiling's and
DeepSpeed's copy, and the settings a run's aio section gives the copy. Pure, but for the
workers it starts.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iotune.workers.swapcopy import ALIGN

COPY_POINTS = "copy_points.jsonl"
COPY_RESULT = "copy.json"
#: each swap file rounded up to a multiple of this: the most threads a copy splits it over,
#: x the O_DIRECT unit, so that every byte goes O_DIRECT
UNIT = ALIGN * 8
#: the copy's chunk: each of its two page-locked buffers
CHUNK = 64 << 20


@dataclass(frozen=True)
class CopySpace:
    block_size: tuple[int, ...]
    queue_depth: tuple[int, ...]
    threads: tuple[int, ...]

    def settings(self) -> list[dict[str, int]]:
        """The aio copy's settings, every combination, the chunk a multiple of the threads'
        O_DIRECT units."""
        return [
            {
                "block_size": b,
                "queue_depth": q,
                "intra_op_parallelism": t,
                "chunk": CHUNK // (ALIGN * t) * ALIGN * t,
            }
            for b, q, t in itertools.product(self.block_size, self.queue_depth, self.threads)
        ]


def swap_sizes(params: int, sub_group: int) -> list[int]:
    """The swap files of *params* parameters in sub-groups of at most *sub_group*: three
    files (fp32 master, two moments) of 4 bytes a parameter each, each rounded up to UNIT."""
    out = []
    left = params
    while left > 0:
        n = min(left, sub_group)
        out += [-(-4 * n // UNIT) * UNIT] * 3
        left -= n
    return out


def label(point: dict[str, Any]) -> str:
    """``aio 1 MiB qd 32 x4``, ``deepspeed``, ``ceiling``, ``reflink``."""
    s = point.get("settings")
    if not s:
        return str(point["copy"])
    return (
        f"aio {s['block_size'] >> 10} KiB qd {s['queue_depth']} x{s['intra_op_parallelism']}"
        if s["block_size"] < 1 << 20
        else f"aio {s['block_size'] >> 20} MiB qd {s['queue_depth']} x{s['intra_op_parallelism']}"
    )


def points(space: CopySpace, reflink: bool) -> list[dict[str, Any]]:
    """Every point of a round, in the first round's order."""
    out: list[dict[str, Any]] = [{"copy": "ceiling"}, {"copy": "deepspeed"}]
    if reflink:
        out.append({"copy": "reflink"})
    out += [{"copy": "aio", "settings": s} for s in space.settings()]
    return out


def round_order(pts: Sequence[dict[str, Any]], r: int) -> list[dict[str, Any]]:
    """Round *r*'s order: the first round's turned by *r* places."""
    k = r % len(pts) if pts else 0
    return [*pts[k:], *pts[:k]]


def load_points(out: Path) -> list[dict[str, Any]]:
    f = out / COPY_POINTS
    if not f.exists():
        return []
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def run_rounds(
    pts: Sequence[dict[str, Any]],
    rounds: int,
    done: Sequence[dict[str, Any]],
    one: Callable[[dict[str, Any]], dict[str, Any]],
    keep: Callable[[dict[str, Any]], None],
) -> list[dict[str, Any]]:
    """Every point of every round not in *done* (a resumed run's records), by *one*, each
    record handed to *keep* as it ends."""
    records = list(done)
    have = {(r["round"], label(r)) for r in done}
    for r in range(rounds):
        for p in round_order(pts, r):
            if (r, label(p)) in have:
                continue
            rec = {**p, "round": r, **one(p)}
            records.append(rec)
            keep(rec)
    return records


def _rate(rec: dict[str, Any]) -> float | None:
    if rec.get("status") != "ok" or not rec.get("durable_s"):
        return None
    return float(rec["bytes"]) / float(rec["durable_s"])


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each point's median durable time and rate; the best aio copy; its rate over the
    ceiling's and over DeepSpeed's copy, each a median of the rounds' ratios (a point and
    the one it is set against, in the same round)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by.setdefault(label(rec), []).append(rec)
    rows = []
    for name, recs in by.items():
        ok = [r for r in recs if _rate(r) is not None]
        rows.append(
            {
                "point": name,
                "copy": recs[0]["copy"],
                "settings": recs[0].get("settings"),
                "rounds": len(ok),
                "failed": len(recs) - len(ok),
                "durable_s": statistics.median(float(r["durable_s"]) for r in ok) if ok else None,
                "blocked_s": statistics.median(
                    float(r.get("blocked_s", r["durable_s"])) for r in ok
                )
                if ok
                else None,
                "bw_bytes_s": statistics.median(_rate(r) or 0.0 for r in ok) if ok else None,
                "error": next((r.get("error") for r in recs if r.get("error")), None),
            }
        )
    aio = [r for r in rows if r["copy"] == "aio" and r["bw_bytes_s"]]
    best = max(aio, key=lambda r: r["bw_bytes_s"]) if aio else None

    def ratio(of: str, to: str) -> float | None:
        per = []
        for r in {rec["round"] for rec in records}:
            a = next((x for x in records if x["round"] == r and label(x) == of), None)
            b = next((x for x in records if x["round"] == r and label(x) == to), None)
            ra, rb = (_rate(a) if a else None), (_rate(b) if b else None)
            if ra and rb:
                per.append(ra / rb)
        return statistics.median(per) if per else None

    return {
        "rows": rows,
        "best": best,
        "of_ceiling": ratio(best["point"], "ceiling") if best else None,
        "over_deepspeed": ratio(best["point"], "deepspeed") if best else None,
    }


def swap_files(preset_name: str, sets: tuple[str, ...] = ()) -> list[int]:
    """Bytes of each optimizer swap file a save of *preset_name* copies, in DeepSpeed's order:
    the fp32 master and the two moments of each swapped sub-group (12 bytes a parameter),
    each rounded up to UNIT (32 KiB: ALIGN x 8 threads, the most the ceiling uses) so that
    every byte goes O_DIRECT: at most 32 KiB more a file."""
    from iotune.model.dsconfig import ds_config
    from iotune.model.presets import preset_with
    from iotune.model.swapfiles import swap_layout

    preset = preset_with(preset_name, sets)
    layout = swap_layout(preset, ds_config(preset))
    return [-(-4 * s // UNIT) * UNIT for s, _ in layout if s for _ in range(3)]


def read_doc(f: Path, message: str, hint: str) -> dict[str, Any]:
    """The JSON document in *f*; one line, *message* and why, where it cannot be read."""
    from iotune.errors import UsageError

    try:
        doc: dict[str, Any] = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise UsageError(message.format(why=why), hint=hint) from exc
    return doc


def load_copy_result(path: Path) -> dict[str, Any] | None:
    """``sweep-checkpoint --copy-from``'s result in *path* (its run directory, or its
    copy.json), for ``estimate --checkpoint-sweep``; None where *path* holds none."""
    from iotune.errors import UsageError

    f = path / COPY_RESULT if path.is_dir() else path
    if f.name != COPY_RESULT or not f.is_file():
        return None
    doc = read_doc(
        f,
        f"{f} is not a copy sweep's result: {{why}}",
        "the run directory of 'iotune sweep-checkpoint --copy-from' (its --out)",
    )
    if not doc.get("bytes") or not any(r.get("rounds") for r in doc.get("rows", [])):
        raise UsageError(
            f"the copy sweep {path} has no copy that ended",
            hint="run it again (--resume), or between other volumes",
        )
    return doc
