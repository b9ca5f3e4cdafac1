"""How often a run can afford to checkpoint, and on how wide a protected array: the time of
one save on a RAID5/6 of W drives like one a datasheet describes, the share of training
time a save every M steps takes, and the narrowest array that keeps that share under a
target (``iotune estimate --checkpoint-every M``). Pure.

A save (iotune.train.checkpoint) with the optimizer state on NVMe copies the swap files: it
reads them from the offload volume and writes them through the page cache to the checkpoint
volume, whose writeback goes on while the copy reads; it is durable when both are done, so
it takes the longer of the two. With the state in host memory there is only the write. On a
RAID5/6 of W members with full stripes, each member writes S / (W - p) of a save of S bytes
(p = 1 or 2 parity members), at its sustained rate once past its SLC cache. The step waits
for the save (DeepSpeed's torch writer): a save every M steps takes
save / (M x step + save) of the training's time.

The members' datasheet rate is derated by what the checkpoint drives' own kind reaches
(:func:`checkpoint_derate`): measured where the drives plan measured drives of that kind,
else DeepSpeed's published ratio; never another kind's factor, whatever else is planned.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from iotune.errors import UsageError
from iotune.plan.cksweeps import copy_rows, writer_rows
from iotune.plan.datasheet import Derate, DriveSpec, load_profiles, parse_drive

if TYPE_CHECKING:
    from iotune.model.presets import Preset
    from iotune.plan.measured import Bandwidth, Baseline
    from iotune.plan.predict import Prediction

PARITY = {5: 1, 6: 2}
#: the widths a plan lists, and the widest --checkpoint-share searches
WIDTHS = range(3, 17)


@dataclass(frozen=True)
class SavePlan:
    width: int
    level: int
    member_bytes: float  # what each member writes of one save
    read_s: float | None  # reading the swap files back from the offload volume
    write_s: float  # the members' writes
    every: int
    step_s: float

    @property
    def save_s(self) -> float:
        return max(self.read_s or 0.0, self.write_s)

    @property
    def bound(self) -> str:
        return "offload reads" if (self.read_s or 0.0) > self.write_s else "checkpoint writes"

    @property
    def share(self) -> float:
        return self.save_s / (self.every * self.step_s + self.save_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "level": f"raid{self.level}",
            "member_write_bytes": round(self.member_bytes),
            "read_s": None if self.read_s is None else round(self.read_s, 3),
            "write_s": round(self.write_s, 3),
            "save_s": round(self.save_s, 3),
            "bound_by": self.bound,
            "share": round(self.share, 4),
        }


#: how the drive parser names its option in its messages
_DRIVE_OPTION = re.compile(r"(?<![\w-])--drive\b(?!s)")


def parse_checkpoint_drive(text: str) -> DriveSpec:
    """``--checkpoint-drive``: a profile or keys, as ``--drive`` takes them; its errors name
    --checkpoint-drive, the option given."""
    try:
        return parse_drive(text)
    except UsageError as exc:
        raise UsageError(
            _DRIVE_OPTION.sub("--checkpoint-drive", exc.message),
            hint=_DRIVE_OPTION.sub("--checkpoint-drive", exc.hint) if exc.hint else None,
        ) from exc


def _same_kind(a: DriveSpec, b: DriveSpec) -> bool:
    """The same drive as far as its speed goes: its name and its datasheet's rates (a profile
    at another capacity is still the kind measured)."""
    return (a.name, a.read, a.write, a.after_cache) == (b.name, b.read, b.write, b.after_cache)


def checkpoint_derate(
    drive: DriveSpec,
    offload: DriveSpec | None,
    plan_derate: dict[str, Any] | None,
    published: Derate | None = None,
) -> Derate:
    """What the checkpoint drives' writes reach of their datasheet's rate: the drives plan's
    measured factor where it measured drives of this kind (*offload*, the --drive a sweep or
    a run measured, is the same kind), else DeepSpeed's published ratio (configs/drives.toml).
    A factor measured on another kind of drive, or none (a plan without a datasheet), does
    not carry over: the checkpoint drives' factor is the same whatever else is planned."""
    d = plan_derate or {}
    if offload is not None and d.get("measured") and _same_kind(drive, offload):
        return Derate(
            float(d["read"]),
            float(d["write"]),
            f"measured on the offload drives, the same kind ({d.get('source')})",
            measured=True,
        )
    if published is None:
        _, published = load_profiles()
    # the published source names both ratios' references: the write's is the one that counts
    _, sep, write_source = published.source.partition("write: ")
    return Derate(
        published.read,
        published.write,
        f"DeepSpeed's published ratio ({write_source if sep else published.source})",
    )


def parse_share(text: str) -> float:
    """--checkpoint-share: '5%' or '0.05'."""
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = -1.0
    if not 0 < v < 1:
        raise UsageError(
            f"--checkpoint-share {text!r} is not a share of the training's time",
            hint="--checkpoint-share 5%",
        )
    return v


def plan_saves(
    save_bytes: float,
    offload_read: float | None,
    step_s: float,
    every: int,
    level: int,
    drive: DriveSpec,
    write_derate: float = 1.0,
    widths: range = WIDTHS,
) -> list[SavePlan]:
    """A save's time and share on a RAID*level* of each width. *offload_read*: the offload
    volume's read rate (bytes/s), None where the state is in host memory; *write_derate*:
    what the writes reach of the datasheet's rate."""
    p = PARITY[level]
    out = []
    for w in widths:
        if w < p + 2:
            continue
        member = save_bytes / (w - p)
        out.append(
            SavePlan(
                width=w,
                level=level,
                member_bytes=member,
                read_s=save_bytes / offload_read if offload_read else None,
                write_s=drive.write_seconds(member, drive.write * write_derate),
                every=every,
                step_s=step_s,
            )
        )
    return out


def narrowest(plans: list[SavePlan], share: float) -> tuple[SavePlan | None, str]:
    """The narrowest array whose share is at most *share*, and the answer in words (what
    keeps a wider one from helping where none does)."""
    for pl in plans:
        if pl.share <= share:
            return pl, (
                f"a RAID{pl.level} of {pl.width} keeps a save every {pl.every} step(s) at "
                f"{100 * pl.share:.1f}% of the training (at most {100 * share:g}%)"
            )
    if not plans:
        return None, "no width planned"
    last = plans[-1]
    if last.bound == "offload reads":
        why = (
            f"each save reads {last.read_s:.1f} s from the offload volume, which no width of "
            "the checkpoint array shortens: save less often (--checkpoint-every) or read faster"
        )
    else:
        why = f"even {last.width} drives take {100 * last.share:.1f}%: save less often"
    return (
        None,
        f"no RAID{last.level} up to {last.width} drives keeps it under {100 * share:g}%: {why}",
    )


def checkpoint_plan(
    save_bytes: float,
    on_nvme: bool,
    plan: dict[str, Any] | None,
    pred_step_s: float | None,
    bw_read: float | None,
    drive: DriveSpec | None,
    every: int,
    level: int,
    share: float,
    sweep: dict[str, Any] | None = None,
    *,
    derate: Derate | None = None,
) -> dict[str, Any]:
    """``estimate --checkpoint-every``: the offload side from the drives plan (its
    --target-step answer, else its widest RAID0) or the prediction on the swept or run
    volume; the checkpoint side from *drive*'s datasheet, derated by *derate* (the drive's
    own: :func:`checkpoint_derate`; DeepSpeed's published ratio where not given), and each
    writer on the volume *sweep* measured (:func:`writer_rows`)."""
    if drive is None and sweep is None:
        raise UsageError(
            "--checkpoint-every needs the checkpoint drives: their datasheet, or a sweep of "
            "the checkpoint volume",
            hint="--checkpoint-drive samsung-980-pro-2tb (or --drive for the same drives), "
            "or --checkpoint-sweep RUN (iotune sweep-checkpoint)",
        )
    copy = sweep if sweep is not None and "copy_from" in sweep else None
    if copy is not None:
        if not on_nvme:
            raise UsageError(
                f"--checkpoint-sweep {copy.get('out') or 'RUN'} timed the copy of NVMe-offloaded "
                "optimizer state, and this model's optimizer is in host memory: a save writes it",
                hint="a sweep of the writers on the checkpoint volume: iotune sweep-checkpoint "
                "--target DIR (without --copy-from)",
            )
        sweep = None
    if drive is not None and derate is None:
        derate = checkpoint_derate(drive, None, None)
    if plan is not None:
        rows = {r["drives"]: r for r in plan["plans"]}
        k = (plan.get("target") or {}).get("drives") or max(rows)
        row = rows[k]
        step_s, read = row.get("step_s"), row["read_bw_bytes_s"]
        offload = f"RAID0 of {k} (the drives plan)"
    else:
        step_s, read, offload = pred_step_s, bw_read, "the swept or run volume"
    if step_s is None:
        raise UsageError(
            "--checkpoint-every needs the step's time, which nothing given predicts",
            hint="add --baseline RUN (a run of this model), with --drive SPEC or --aio-config SWEEP",
        )
    writers = writer_rows(save_bytes, on_nvme, every, step_s, sweep)
    copies = copy_rows(save_bytes, every, step_s, copy) if copy is not None else []
    plans = (
        plan_saves(save_bytes, read if on_nvme else None, step_s, every, level, drive, derate.write)
        if drive is not None and derate is not None
        else []
    )
    best, answer = narrowest(plans, share)
    if drive is None and copy is not None:
        fit = [c["copy"] for c in copies if c["share"] <= share and c["copy"] != "ceiling"]
        answer = (
            f"between the swept volumes, the {' and '.join(fit)} "
            f"{'copy keeps' if len(fit) == 1 else 'copies keep'} a save every {every} "
            f"step(s) under {100 * share:g}% of the training"
            if fit
            else f"no copy keeps a save every {every} step(s) under {100 * share:g}% between the "
            "swept volumes: save less often, or plan the checkpoint drives (--checkpoint-drive)"
        )
    elif drive is None:
        fit = [w for w in writers if w["share"] <= share]
        answer = (
            f"on the swept volume, {', '.join(sorted({w['writer'] for w in fit}))} keep(s) a save "
            f"every {every} step(s) under {100 * share:g}% of the training"
            if fit
            else f"no writer keeps a save every {every} step(s) under {100 * share:g}% on the "
            "swept volume: save less often, or plan a wider array (--checkpoint-drive)"
        )
    return {
        "save_bytes": round(save_bytes),
        "every": every,
        "level": f"raid{level}",
        "step_s": round(step_s, 3),
        "offload": offload,
        "offload_read_bytes_s": round(read) if on_nvme and read else None,
        "drive": drive.to_json() if drive is not None else None,
        "writers": writers,
        "writers_volume": (sweep or {}).get("target"),
        "copies": copies,
        "copies_volumes": f"{copy['copy_from']} to {copy['target']}" if copy is not None else None,
        "copies_note": (
            "each width's SAVE s is a copy at the drives' rates, its reads and writes at once "
            "(--checkpoint-copy aio: the step waits for it, durable at its end); DeepSpeed's "
            "copytree goes through the page cache and is known only where measured "
            "(--checkpoint-sweep RUN of 'iotune sweep-checkpoint --copy-from')"
            if on_nvme and plans
            else None
        ),
        "writers_note": (
            None
            if copy is not None
            else "with the optimizer state on NVMe every writer copies the swap files "
            "(shutil.copytree): the writer only writes the small files beside them"
            if on_nvme
            else None
            if sweep is not None
            else "each writer: --checkpoint-sweep RUN (iotune sweep-checkpoint on the checkpoint volume)"
        ),
        "write_derate": derate.write if derate is not None else None,
        "write_derate_source": derate.source if derate is not None else None,
        "write_derate_measured": derate.measured if derate is not None else None,
        "plans": [pl.to_json() for pl in plans],
        "share_target": share,
        "width": best.width if best else None,
        "answer": answer,
    }


def plan_for_estimate(
    p: Preset,
    plan: dict[str, Any] | None,
    pred: Prediction | None,
    bw: Bandwidth | None,
    base: Baseline | None,
    *,
    save_bytes: float,
    drive: str | None,
    checkpoint_drive: str | None,
    every: int | None,
    level: int,
    share: str,
    sweep: str | None,
) -> dict[str, Any]:
    """``estimate --checkpoint-every`` from the command's options: *save_bytes* (the I/O
    model's, iotune.train.checkpoint.save_volume), the step from the prediction (or a RAM run's own, for state in RAM), the
    checkpoint drives from ``--checkpoint-drive`` (else ``--drive``), the sweep's record."""
    from pathlib import Path

    from iotune.sweep.ckpt import load_result
    from iotune.sweep.copysweep import load_copy_result

    if every is None:
        raise UsageError(
            "--checkpoint-sweep plans checkpoints, and --checkpoint-every says how often",
            hint="--checkpoint-every 100 --checkpoint-sweep RUN",
        )
    target_share = parse_share(share)
    offload_spec = parse_drive(drive) if drive else None
    ck_spec = parse_checkpoint_drive(checkpoint_drive) if checkpoint_drive else offload_spec
    on_nvme = p.strategy.optimizer == "nvme"
    step_s = pred.step_s if pred else None
    if step_s is None and base is not None and base.kind == "ram" and not on_nvme:
        # the state in RAM and a RAM run of the model: its own step is the step
        step_s = base.forward_backward_s + (base.optimizer_s or 0.0)
    return checkpoint_plan(
        save_bytes,
        on_nvme,
        plan,
        step_s,
        bw.read if bw else None,
        ck_spec,
        every,
        level,
        target_share,
        (load_copy_result(Path(sweep)) or load_result(Path(sweep))) if sweep else None,
        # the checkpoint drives' own derating: the plan's only where it measured their kind
        derate=checkpoint_derate(ck_spec, offload_spec, (plan or {}).get("derate"))
        if ck_spec is not None
        else None,
    )
