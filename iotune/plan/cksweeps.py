"""Each save measured on the volumes, scaled to the save a plan makes: DeepSpeed's writers on
the checkpoint volume (``iotune sweep-checkpoint``) for state in host memory, and the copies of
the swap files between the offload and the checkpoint volume (``sweep-checkpoint
--copy-from``) for state on NVMe: what the step waits for, when the save is durable, and the
share of the training the waits take (``iotune estimate --checkpoint-sweep RUN``). Pure."""

from __future__ import annotations

from typing import Any


def writer_rows(
    save_bytes: float,
    on_nvme: bool,
    every: int,
    step_s: float,
    sweep: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """Each DeepSpeed writer's save of *save_bytes* every *every* steps on the checkpoint
    volume that *sweep* (``iotune sweep-checkpoint``'s result) measured: what the step
    waits for, when the save is durable, and the share of the training the waits take.
    Its per-byte times are scaled to this save. ``torch``: torch.save returns before its
    writeback ends; ``fast``: the writer ends with its fsync, with DeepSpeed's defaults and
    with the sweep's best; ``decoupled``: the best's save in a process of its own, which the
    step waits for only when the next save comes before it is durable. With the optimizer
    state on NVMe every writer copies the swap files, and none is planned apart (None)."""
    if on_nvme or sweep is None:
        return []
    interval = every * step_s
    per = save_bytes

    def scaled(rec: dict[str, Any] | None, key: str) -> float | None:
        if not rec or rec.get("status") != "ok" or not rec.get("bytes"):
            return None
        return float(rec[key]) * per / float(rec["bytes"])

    rows = []
    torch_rec, default, best = sweep.get("torch"), sweep.get("default"), sweep.get("best")
    for writer, rec, how in (
        ("torch", torch_rec, "torch.save, DeepSpeed's default"),
        ("fast", default, "FastPersist with DeepSpeed's defaults"),
        ("fast", best, "FastPersist as tuned (" + _label(best) + ")"),
        ("decoupled", best, "FastPersist as tuned, in its own process"),
    ):
        durable = scaled(rec, "durable_s")
        waits = scaled(rec, "blocked_s")
        if durable is None or waits is None:
            continue
        if writer == "decoupled":
            waits = max(0.0, durable - interval)
        rows.append(
            {
                "writer": writer,
                "how": how,
                "waits_s": round(waits, 3),
                "durable_s": round(durable, 3),
                "share": round(waits / (interval + waits), 4),
            }
        )
    return rows


#: a copy sweep's points as a plan shows them: the point, the name, how it copies
_COPIES = (
    ("deepspeed", "deepspeed", "shutil.copytree, DeepSpeed's save (--checkpoint-copy deepspeed)"),
    ("best", "aio", "iotune's aio copy as swept best, {point} (--checkpoint-copy aio)"),
    (
        "reflink",
        "reflink",
        "a clone of each file on the offload volume (--checkpoint-copy reflink)",
    ),
    ("ceiling", "ceiling", "the raw O_DIRECT copy between the volumes: their ceiling"),
)


def copy_rows(
    save_bytes: float, every: int, step_s: float, copy: dict[str, Any]
) -> list[dict[str, Any]]:
    """With the optimizer state on NVMe, each copy of the swap files that *copy* (``iotune
    sweep-checkpoint --copy-from``'s result) timed between the two volumes, its medians scaled
    to *save_bytes*: what the step waits for (the copy's return), when the save is durable,
    and the share of the training the waits take with a save every *every* steps."""
    by = {r["point"]: r for r in copy.get("rows", [])}
    best = copy.get("best") or {}
    scale = save_bytes / float(copy["bytes"])
    interval = every * step_s
    rows = []
    for point, name, how in _COPIES:
        rec = by.get(best.get("point", "") if point == "best" else point)
        if not rec or not rec.get("rounds") or rec.get("durable_s") is None:
            continue
        waits, durable = float(rec["blocked_s"]) * scale, float(rec["durable_s"]) * scale
        rows.append(
            {
                "copy": name,
                "how": how.format(point=rec["point"]),
                "waits_s": round(waits, 3),
                "durable_s": round(durable, 3),
                "share": round(waits / (interval + waits), 4),
            }
        )
    return rows


def _label(best: dict[str, Any] | None) -> str:
    from iotune.sweep.ckpt import knobs_of

    return knobs_of(best).label() if best else "-"
