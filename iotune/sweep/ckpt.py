"""`iotune sweep-checkpoint`: DeepSpeed's fast checkpoint writer (FastPersist) tuned on the
checkpoint volume, against torch.save and the volume's own write ceiling.

Each point is one real save: DeepSpeed's FastFileWriter (``deepspeed.io``, what the
``fast`` and ``decoupled`` writers use) serialises a ZeRO-3 optimizer state of N
parameters (the fp32 master and Adam's two moments, in sub-groups as ZeRO-3 keeps them:
12 bytes a parameter) with ``torch.save`` into the volume, and the save ends with the
writer's own fsync, so its time is the time to durability. The knobs are the writer's
(``checkpoint.writer``: ``io_buffer_size``, ``io_buffer_double``) and the aio handle's it
writes through (``aio``: ``block_size``, ``queue_depth``, ``intra_op_parallelism``), and
torch.save's own CRC32 of every zip record, which the writer cannot skip but a training
script can (``torch.serialization.set_crc32_options(False)``), and the writer's copy of each
record: its ``write`` turns the buffer torch.save hands it into a tensor with
``numpy.array`` (deepspeed/io/utils.py ``bytes_to_tensor``), a second copy of the whole
state in fresh memory before the copy into its pinned buffer; ``torch.frombuffer`` reads the
record where it is. They are searched a knob at a time from DeepSpeed's defaults, each
stage keeping the fastest save so far (a grid of them all would be hundreds of saves). ``torch.save`` of the same state is
timed once, to its return (what the step waits for) and to its fsync (durable).

The search is a pure function of the records so far (:func:`next_point`): a run that is
interrupted resumes where it stopped (``--resume``). Pure, apart from the record files.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from iotune.records import append_record, read_records
from iotune.units import GIB, binary_size

POINTS = "ckpt_points.jsonl"
RESULT = "ckpt.json"
#: what ZeRO-3 keeps per parameter of a rank's partition: fp32 master, exp_avg, exp_avg_sq
STATE_BYTES_PER_PARAM = 12
#: the share of the volume's write ceiling the tuned writer should reach
GOAL_SHARE = 0.8


@dataclass(frozen=True)
class Knobs:
    """One setting of the fast writer: its own two knobs and its aio handle's."""

    crc32: bool = (
        True  # torch.save's CRC32 of each zip record (torch.serialization.set_crc32_options)
    )
    record_copy: bool = True  # the writer's numpy copy of each record (io/utils.py)
    io_buffer_size: int = 64 * 2**20  # CHECKPOINT_IO_BUFFER_SIZE_DEFAULT
    io_buffer_double: bool = True
    block_size: int = 2**20  # AIO_BLOCK_SIZE_DEFAULT
    queue_depth: int = 8
    threads: int = 1  # intra_op_parallelism
    single_submit: bool = False
    overlap_events: bool = True

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def writer_section(self) -> dict[str, Any]:
        return {
            "type": "fast",
            "io_buffer_size": self.io_buffer_size,
            "io_buffer_double": self.io_buffer_double,
        }

    def aio_section(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "queue_depth": self.queue_depth,
            "intra_op_parallelism": self.threads,
            "single_submit": self.single_submit,
            "overlap_events": self.overlap_events,
        }

    def label(self) -> str:
        buf = (
            f"{binary_size(self.io_buffer_size)} {'double' if self.io_buffer_double else 'single'}"
        )
        crc = "" if self.crc32 else ", no CRC32"
        crc += "" if self.record_copy else ", records in place"
        return f"{buf}, {binary_size(self.block_size)} blocks, qd {self.queue_depth}, {self.threads} thread(s){crc}"


DEFAULTS = Knobs()
#: the order the search takes the knobs in: the buffer first (it decides how much each
#: drain gives the handle), then how the handle splits and queues it
STAGES = (
    "crc32",
    "record_copy",
    "io_buffer_size",
    "io_buffer_double",
    "block_size",
    "queue_depth",
    "threads",
)
KNOB_WORDS = {
    "crc32": "torch.save's CRC32",
    "record_copy": "the writer's copy of each record",
    "io_buffer_size": "io_buffer_size",
    "io_buffer_double": "io_buffer_double",
    "block_size": "aio block_size",
    "queue_depth": "aio queue_depth",
    "threads": "aio intra_op_parallelism",
}


@dataclass(frozen=True)
class Space:
    crc32: tuple[bool, ...] = (True, False)
    record_copy: tuple[bool, ...] = (True, False)
    io_buffer_size: tuple[int, ...] = (16 * 2**20, 64 * 2**20, 256 * 2**20, GIB)
    io_buffer_double: tuple[bool, ...] = (True, False)
    block_size: tuple[int, ...] = (256 * 2**10, 2**20, 4 * 2**20, 16 * 2**20)
    queue_depth: tuple[int, ...] = (8, 32, 128)
    threads: tuple[int, ...] = (1, 4, 8)
    #: rounds of the search at most (next_point)
    rounds: int = 3

    def size(self) -> int:
        """The saves the search's first round takes: the defaults, then each stage's values
        but the default's (no stage before it changes its knob, so its base still has
        that). Another round takes at most as many again, each value not yet saved."""
        return 1 + sum(
            len(getattr(self, s)) - (getattr(DEFAULTS, s) in getattr(self, s)) for s in STAGES
        )

    def to_json(self) -> dict[str, Any]:
        return {
            f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
            for f in fields(self)
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Space:
        args: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return Space(**args)


def save_in_worker(payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One save (or the ceiling) in a worker process; a failure is the record's status, as
    sweep-aio records its points'."""
    from iotune.sweep.runner import run_worker

    rec: dict[str, Any] = {}
    run_worker("iotune.workers.ckpt_save", payload, timeout, rec)
    return rec


def knobs_of(rec: dict[str, Any]) -> Knobs:
    """A record's knobs (one made before a knob existed had DeepSpeed's default of it)."""
    return Knobs(**{f.name: rec.get(f.name, getattr(DEFAULTS, f.name)) for f in fields(Knobs)})


def fast_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("writer") == "fast"]


def fastest(records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The fast writer's save that was durable soonest, among those that succeeded."""
    ok = [r for r in fast_records(records) if r.get("status") == "ok"]
    return min(ok, key=lambda r: r["durable_s"]) if ok else None


def _order(rec: dict[str, Any]) -> tuple[int, int]:
    """Where a record stands in the search: (round, stage), the defaults first."""
    if rec.get("stage") == "default":
        return (0, 0)
    return (int(rec.get("round", 1)), STAGES.index(rec["stage"]))


def next_point(space: Space, records: Sequence[dict[str, Any]]) -> tuple[str, int, Knobs] | None:
    """The next save to time, its stage and round; None when the search is done.

    DeepSpeed's defaults first; then, knob by knob in STAGES' order, each value of the
    space on the fastest save so far; then the same again from the best, while a round
    finds a faster save (``space.rounds`` at most: a knob's best can depend on another's
    value, more in flight paying only with a buffer that holds it)."""
    fast = fast_records(records)
    done = {r["key"] for r in fast}
    if DEFAULTS.key() not in done:
        return "default", 0, DEFAULTS
    for rnd in range(1, space.rounds + 1):
        if rnd > 1:
            before = fastest([r for r in fast if _order(r) < (rnd - 1, 0)])
            after = fastest([r for r in fast if _order(r) < (rnd, 0)])
            if before is None or after is None or after["key"] == before["key"]:
                return None
        for i, stage in enumerate(STAGES):
            # the fastest of the stages before this one: a later stage's find does not
            # reopen it within the round
            best = fastest([r for r in fast if _order(r) < (rnd, i)])
            base = knobs_of(best) if best is not None else DEFAULTS
            for value in getattr(space, stage):
                k = replace(base, **{stage: value})
                if k.key() not in done:
                    return stage, rnd, k
    return None


def run_search(
    space: Space,
    records: list[dict[str, Any]],
    measure: Callable[[str, Knobs], dict[str, Any]],
    out: Path,
    on_point: Callable[[dict[str, Any], int], None] | None = None,
) -> list[dict[str, Any]]:
    """Time saves until :func:`next_point` has none left; each record is appended to
    OUT/ckpt_points.jsonl as soon as it exists (an interrupt loses none)."""
    while (nxt := next_point(space, records)) is not None:
        stage, rnd, k = nxt
        rec = {
            "writer": "fast",
            "stage": stage,
            "round": rnd,
            "key": k.key(),
            **asdict(k),
            **measure(stage, k),
        }
        append_record(out / POINTS, rec)
        records.append(rec)
        if on_point:
            on_point(rec, len(fast_records(records)))
    return records


def load_points(out: Path) -> list[dict[str, Any]]:
    return list(read_records(out / POINTS)) if (out / POINTS).exists() else []


def _rate(rec: dict[str, Any] | None) -> float | None:
    if rec is None or rec.get("status") != "ok" or not rec.get("durable_s"):
        return None
    return float(rec["bytes"]) / float(rec["durable_s"])


def stage_gains(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each stage that moved the best: the knob, from and to, and the speed-up it gave
    (the stage's fastest save against the fastest before it)."""
    out = []
    seen: list[dict[str, Any]] = []
    fast = fast_records(records)
    for pos in sorted({_order(r) for r in fast}):
        before = fastest(seen)
        seen += [r for r in fast if _order(r) == pos]
        after = fastest(seen)
        if pos == (0, 0) or before is None or after is None or after is before:
            continue
        stage = STAGES[pos[1]]
        was, now = getattr(knobs_of(before), stage), getattr(knobs_of(after), stage)
        if now != was:
            out.append(
                {
                    "knob": stage,
                    "from": was,
                    "to": now,
                    "speedup": before["durable_s"] / after["durable_s"],
                }
            )
    return out


def _value(knob: str, v: Any) -> str:
    if knob in ("io_buffer_size", "block_size"):
        return binary_size(int(v))
    if knob == "io_buffer_double":
        return "double" if v else "single"
    if knob in ("crc32", "record_copy"):
        return "on" if v else "off"
    return str(v)


def why_default(default: dict[str, Any], ceiling: float | None) -> str:
    """Where DeepSpeed's default setting spent its save: filling the pinned buffer (a copy
    in memory) or waiting on the drive (the handle's writes), from the writer's own
    statistics."""
    total = float(default["durable_s"])
    fill, wait = float(default.get("fill_s") or 0.0), float(default.get("aio_write_s") or 0.0)
    wait = min(wait, total)  # DeepSpeed counts its close's last drain twice
    copy = float(default.get("copy_s") or 0.0)
    k = knobs_of(default)
    inflight = k.queue_depth * k.threads
    text = (
        f"the default spent {fill:.2f} s of its {total:.2f} s filling its "
        f"{_value('io_buffer_size', k.io_buffer_size)} buffer, {wait:.2f} s waiting on "
        f"writes of {binary_size(k.block_size)} blocks with at most {inflight} in flight, "
    )
    if default.get("copy_s") is not None:
        text += (
            f"{copy:.2f} s copying each record before that (numpy.array in DeepSpeed's "
            "io/utils.py bytes_to_tensor), "
        )
    text += (
        f"and {max(0.0, total - fill - wait - copy):.2f} s in torch.save's own work between "
        "the writes (pickling, and the zip records' CRC32 while it is on)"
    )
    rate = _rate(default)
    if ceiling and rate:
        text += f"; it reached {100 * rate / ceiling:.0f}% of the volume's write ceiling"
    return text


def _where_best_went(best: dict[str, Any], ceil_bw: float) -> str:
    """The best save's time: waiting on the drive, or between the writes (torch.save's own
    work, the writer's copy of each record). DeepSpeed counts the close's last drain twice
    in its wait: the wait is capped at the save's time."""
    durable = float(best["durable_s"])
    wait = min(float(best["aio_write_s"]), durable)
    copy = float(best.get("copy_s") or 0.0)
    serial = max(0.0, durable - wait - float(best.get("fill_s") or 0.0) - copy)
    writing = float(best["bytes"]) / wait
    text = f"the best's writes alone ran at {100 * writing / ceil_bw:.0f}% of the ceiling; "
    if serial + copy < 0.05 * durable:
        return text + (
            "it spent its save filling its buffer and waiting on the drive: the drive, as the "
            "writer keeps it busy (one buffer half in flight at a time, its queue emptied "
            "between them), is its bound"
        )
    text += f"{serial:.2f} s of its save is torch.save's work between the writes"
    if copy >= 0.005:
        text += f", and {copy:.2f} s the writer's copy of each record"
    return text + ", which the writer does not overlap"


def summarize(records: Sequence[dict[str, Any]], ceiling: dict[str, Any] | None) -> dict[str, Any]:
    """The result: the default, the best, torch.save, the goal, and why in words."""
    fast = fast_records(records)
    default = next((r for r in fast if r["key"] == DEFAULTS.key()), None)
    best = fastest(records)
    torch_rec = next((r for r in records if r.get("writer") == "torch"), None)
    ceil_bw = float(ceiling["bw_bytes_s"]) if ceiling and ceiling.get("bw_bytes_s") else None
    lines: list[str] = []
    if default is not None and default.get("status") == "ok":
        lines.append(why_default(default, ceil_bw))
    gains = stage_gains(records)
    for g in gains:
        lines.append(
            f"{KNOB_WORDS[g['knob']]} {_value(g['knob'], g['from'])} -> "
            f"{_value(g['knob'], g['to'])}: {g['speedup']:.2f}x faster to durable"
        )
    if best is not None and not gains:
        lines.append("no knob beat DeepSpeed's defaults on this volume")
    best_bw = _rate(best)
    share = best_bw / ceil_bw if best_bw and ceil_bw else None
    torch_ok = torch_rec is not None and torch_rec.get("status") == "ok"
    goal: dict[str, Any] = {
        "share_of_ceiling": None if share is None else round(share, 4),
        "share_target": GOAL_SHARE,
        "beats_torch_to_durable": (
            best["durable_s"] < torch_rec["durable_s"] if best and torch_rec and torch_ok else None
        ),
    }
    goal["met"] = bool(share is not None and share >= GOAL_SHARE and goal["beats_torch_to_durable"])
    if best is not None and ceil_bw and best.get("aio_write_s"):
        lines.append(_where_best_went(best, ceil_bw))
    if best is not None and torch_ok and torch_rec is not None:
        lines.append(
            f"torch.save: the step waits {torch_rec['blocked_s']:.2f} s, durable at "
            f"{torch_rec['durable_s']:.2f} s; the tuned fast writer: durable at "
            f"{best['durable_s']:.2f} s (the step waits for all of it)"
        )
    return {
        "default": default,
        "best": best,
        "torch": torch_rec,
        "ceiling": ceiling,
        "gains": gains,
        "goal": goal,
        "why": lines,
        "config": (
            {
                "checkpoint": {"writer": knobs_of(best).writer_section()},
                "aio": knobs_of(best).aio_section(),
            }
            if best is not None
            else None
        ),
        "script": script_advice(best),
    }


def merge_checkpoint(existing: dict[str, Any], best: Knobs) -> tuple[dict[str, Any], str | None]:
    """*existing* with the tuned writer in its ``checkpoint.writer`` (other keys kept, a
    ``decoupled`` setting too) and the tuned aio handle in ``aio`` where it has none. The
    offload's swaps read the same ``aio`` section: one already there is kept, and the note
    says what the writer would have had."""
    merged: dict[str, Any] = json.loads(json.dumps(existing))
    ck = merged.setdefault("checkpoint", {})
    ck["writer"] = {**(ck.get("writer") or {}), **best.writer_section()}
    note = None
    if "aio" in merged and merged["aio"] != best.aio_section():
        note = (
            f"kept the config's \"aio\" section, which the offload's swaps read too; the "
            f"writer's best was {json.dumps(best.aio_section())}"
        )
    else:
        merged["aio"] = best.aio_section()
    return merged, note


def script_advice(best: dict[str, Any] | None) -> str | None:
    """What the training script must do for the best save, where DeepSpeed's config cannot
    say it: torch.save's CRC32 off, the writer's records read in place."""
    if best is None:
        return None
    says = []
    if not best.get("crc32", True):
        says.append(
            "torch.serialization.set_crc32_options(False) in the training script before its "
            "saves (torch 2.6 and newer; torch.load reads such files)"
        )
    if not best.get("record_copy", True):
        says.append(
            "deepspeed.io.fast_file_writer.bytes_to_tensor = lambda b: torch.frombuffer(b, "
            "dtype=torch.uint8) (the writer then copies each record once, into its pinned "
            "buffer, not twice; torch.save hands it no empty record, and torch warns once that "
            "the record is read-only: the writer only reads it)"
        )
    if not says:
        return None
    return (
        " and ".join(says)
        + " at the top of the training script (the decoupled writer's process imports it "
        "again); DeepSpeed's config has no key for these"
    )


def load_result(path: Path) -> dict[str, Any]:
    """A sweep-checkpoint run's result (RUN/ckpt.json), for ``estimate --checkpoint-sweep``."""
    from iotune.errors import UsageError
    from iotune.sweep.copysweep import read_doc

    f = path / RESULT if path.is_dir() else path
    doc = read_doc(
        f,
        f"{path} holds no sweep-checkpoint result ({f.name}: {{why}})",
        "the run directory of 'iotune sweep-checkpoint' (its --out)",
    )
    if not doc.get("best"):
        raise UsageError(
            f"the sweep-checkpoint run {path} has no successful save of the fast writer",
            hint="run it again (--resume), or on another volume",
        )
    return doc
