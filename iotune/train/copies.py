"""How a run's saves copy the swap files, checked before it starts; nothing is written.

- ``--checkpoint-copy aio|reflink`` (iotune/workers/swapcopy.py): refused where there are no
  swap files to copy, and reflink where the files cannot be cloned.
- ``--checkpoint-persist DIR``: each save is a snapshot by reflink in --checkpoint-dir, on
  the offload volume, and a process of its own copies it into DIR while the next steps
  train (iotune/workers/persist.py). Refused where that cannot work: a save that is not a
  snapshot, DIR on the snapshots' own volume (a copy there survives nothing they do not),
  DIR unfit for the saves (check_folder)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from iotune.checks import fstype
from iotune.errors import UsageError
from iotune.probes.mounts import existing_ancestor
from iotune.train.checkpoint import Checkpointing, check_folder


def snapshot_steps(ck: Checkpointing, steps: int) -> int:
    """The steps whose saves the snapshot folder holds at once: all of them, or, where each
    is persisted and then removed, two (the one being copied and the next)."""
    return steps if ck.persist is None else min(steps, 2 * ck.every)


def check_persist(
    ck: Checkpointing, steps: int, offload: list[Path], need: int, copy: str
) -> list[str]:
    """The persist folder's checks (none without one); the notes to show."""
    if ck.persist is None:
        return []
    if copy != "reflink":
        raise UsageError(
            f"--checkpoint-persist copies each save's snapshot, which --checkpoint-copy "
            f"reflink takes; this run's saves copy the swap files by {copy}",
            hint="--checkpoint-copy reflink with --checkpoint-dir on the offload volume, or "
            "drop --checkpoint-persist and give its folder as --checkpoint-dir",
        )
    dest = existing_ancestor(ck.persist)
    if dest.stat().st_dev == existing_ancestor(ck.dir).stat().st_dev:
        raise UsageError(
            f"--checkpoint-persist {ck.persist} is on the volume of the snapshots "
            f"(--checkpoint-dir {ck.dir}): a copy there survives nothing they do not",
            hint="persist to a volume of its own (a RAID5/6: 'iotune raid create --level 6')",
        )
    return check_folder(replace(ck, dir=ck.persist, persist=None), steps, offload, need, False)


def check_copy(
    copy: str, on_nvme: bool, nvmes: list[Path], ck_dir: Path | None, resume: Any
) -> None:
    """--checkpoint-copy aio|reflink: refused where there are no swap files to copy, and
    reflink where a save's or the resume's files cannot be cloned (tried: a 4 KiB file)."""
    from iotune.workers.swapcopy import clone_problem

    if not on_nvme:
        raise UsageError(
            f"--checkpoint-copy {copy} copies the swap files of an optimizer on NVMe, and this "
            "run keeps its optimizer state in host memory",
            hint="drop --checkpoint-copy (its saves are DeepSpeed's files alone), or run a "
            "preset with the optimizer on NVMe",
        )
    if copy != "reflink":
        return
    pairs = [(n, existing_ancestor(ck_dir)) for n in nvmes] if ck_dir else []
    pairs += [(Path(resume[0]), n) for n in nvmes] if resume else []
    for a, b in pairs:
        src, dst = existing_ancestor(a), existing_ancestor(b)
        why = clone_problem(src, dst)
        if why is not None:
            raise UsageError(
                f"--checkpoint-copy reflink: the swap files cannot be cloned from {src} "
                f"({fstype(src)}) into {dst} ({fstype(dst)}): {why}",
                hint="make the volume XFS with reflink (mkfs.xfs -m reflink=1, its default) "
                "or btrfs, with the checkpoints on the offload volume; or --checkpoint-copy aio",
            )
