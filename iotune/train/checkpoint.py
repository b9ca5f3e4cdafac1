"""Checkpoints of a run (`--checkpoint-every N --checkpoint-dir DIR [--checkpoint-writer]`,
`--resume-from DIR`): what a save moves, whether the folder can take it, and whether a
folder holds a checkpoint of this model. Pure, apart from looking at the folders.

What DeepSpeed's ZeRO-3 ``save_checkpoint`` writes (runtime/engine.py, 0.19.8), per rank:

- ``zero_pp_rank_R_mp_rank_00_model_states.pt`` and ``..._optim_states.pt``, through the
  checkpoint writer (``torch.save``, or FastPersist's ``fast`` writer, or its ``decoupled``
  engine in a process of its own);
- with the optimizer state on NVMe, a copy of the rank's swap folder (its fp32 master and
  Adam moments, 12 bytes a swapped parameter; the gradient files left out) under
  ``TAG/offloaded_tensors/rankRR/``, made by ``shutil.copytree`` whatever the writer: the save
  reads those files from the offload volume and writes them to the checkpoint's.

The I/O model counts that copy to the byte (the swap files are the model's); the two .pt
files are a pickle of the state dicts, small with the state on NVMe, and are measured, not
modelled. With the optimizer state in host memory the optim_states file holds it (about
12 bytes a parameter), through the writer.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iotune.checks import fstype
from iotune.errors import UsageError
from iotune.model.estimate import Estimate, IoVolume
from iotune.probes.fabrics import refuse_lost
from iotune.probes.mounts import existing_ancestor
from iotune.train.parity import drive_sizes, parity_traffic, persist_io

if TYPE_CHECKING:
    from iotune.trace.targets import Array

WRITERS = ("torch", "fast", "decoupled")
#: file systems the kernel serves from itself (/proc, /sys, ...): nothing can be saved there
KERNEL_FS = frozenset(
    {
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "devpts",
        "debugfs",
        "tracefs",
        "securityfs",
        "pstore",
        "bpf",
        "configfs",
        "efivarfs",
        "fusectl",
        "mqueue",
        "nsfs",
        "binfmt_misc",
        "selinuxfs",
        "rpc_pipefs",
    }
)
#: the tag of the save after step N
TAG = "step{}"
#: what DeepSpeed's copy of the swap folder is called in a checkpoint
OFFLOADED = "offloaded_tensors"


@dataclass(frozen=True)
class Checkpointing:
    every: int
    dir: Path
    writer: str = "torch"
    writer_given: bool = True  # --checkpoint-writer given (else the config's, or torch)
    #: --checkpoint-persist: each save (a snapshot in dir) copied there in the background
    persist: Path | None = None

    def tag(self, step: int) -> str:
        return TAG.format(step)

    def saves(self, steps: int) -> int:
        return steps // self.every

    def ds_config(self) -> dict[str, dict[str, Any]] | None:
        """DeepSpeed's ``checkpoint`` section for the writer (None: torch.save, its
        default)."""
        if self.writer == "torch":
            return None
        return {"writer": {"type": "fast", "decoupled": self.writer == "decoupled"}}


def config_writer(cfg: dict[str, Any]) -> str | None:
    """The writer a DeepSpeed config's ``checkpoint.writer`` names (FastPersist's ``fast``,
    ``decoupled`` with its flag), or None where it names none."""
    w = (cfg.get("checkpoint") or {}).get("writer")
    if not isinstance(w, dict) or str(w.get("type", "")).lower() != "fast":
        return None
    return "decoupled" if w.get("decoupled") else "fast"


def with_writer(
    ck: Checkpointing, cfg: dict[str, Any]
) -> tuple[Checkpointing, dict[str, Any], list[str]]:
    """The writer a run saves with, and the config that says so: --checkpoint-writer where
    given (it replaces the config's, whose other writer keys stay), else the config's own,
    else torch.save. The notes to show."""
    own = config_writer(cfg)
    if not ck.writer_given:
        ck = replace(ck, writer=own or "torch", writer_given=True)
    notes = []
    if own is not None and own != ck.writer:
        notes.append(f"--checkpoint-writer {ck.writer} replaces the config's {own} writer")
    section: dict[str, Any] = dict(cfg.get("checkpoint") or {})
    if ck.writer == "torch":
        section.pop("writer", None)
    else:
        old = section.get("writer")
        ours = (ck.ds_config() or {})["writer"]
        section["writer"] = {**(old if isinstance(old, dict) else {}), **ours}
    cfg = {k: v for k, v in cfg.items() if k != "checkpoint"}
    return ck, {**cfg, "checkpoint": section} if section else cfg, notes


def save_volume(est: Estimate, optimizer_on_nvme: bool) -> IoVolume:
    """What one save moves on this node, as modelled (module docstring): with the optimizer
    state on NVMe, its swap files read from the offload volume and written to the
    checkpoint's; without, the state written through the writer (about 12 bytes a
    parameter a rank, not exact: a pickle)."""
    sw = est.swapped
    if optimizer_on_nvme:
        copied = 12 * sw.n_s * est.ranks
        return IoVolume(copied, copied)
    return IoVolume(0, 12 * est.params * est.ranks // max(1, est.world))


def check_folder(
    ck: Checkpointing,
    steps: int,
    offload: list[Path],
    need: int,
    force: bool,
    copy: str = "deepspeed",
) -> list[str]:
    """Refuse a checkpoint folder that cannot take the run's saves: on a file system the
    kernel serves from itself (/proc, /sys), not writable, on the offload volume (without
    --force; a reflink *copy* is a snapshot there, by design), too small. The room asked is
    the whole copy's for reflink too: the next step's swaps rewrite the files, and each save
    then holds its own extents. Nothing is written. The notes to show."""
    notes = []
    if ck.dir.exists() and not ck.dir.is_dir():
        raise UsageError(f"--checkpoint-dir {ck.dir} is not a folder", hint="name a folder")
    base = existing_ancestor(ck.dir)
    refuse_lost(base, "--checkpoint-dir")
    fs = fstype(base)
    if fs in KERNEL_FS:
        # root may "write" there (access(2) says yes) and statfs reports 0 bytes free: neither
        # is the reason
        raise UsageError(
            f"--checkpoint-dir {ck.dir} is on {fs}, the kernel's own file system: it holds no "
            "files a checkpoint could be written to",
            hint="name a folder on the checkpoint volume (a file system on a drive or an array)",
        )
    if not os.access(base, os.W_OK | os.X_OK):
        raise UsageError(
            f"--checkpoint-dir {ck.dir} is not writable ({base})",
            hint="name a folder you can write to, on the checkpoint volume",
        )
    dev = base.stat().st_dev
    shared = [o for o in offload if existing_ancestor(o).stat().st_dev == dev]
    if shared and copy == "reflink":
        notes.append(
            f"--checkpoint-dir {ck.dir} is on the offload volume ({shared[0]}), as a reflink "
            "snapshot must be: each save shares the swap files' extents until the next "
            "step's swaps rewrite them, then holds its own, and a full volume stops the training"
        )
    elif shared:
        msg = (
            f"--checkpoint-dir {ck.dir} is on the offload volume ({shared[0]}): its saves "
            "compete with the swaps, and a full volume stops the training"
        )
        if not force:
            raise UsageError(
                msg, hint="put checkpoints on a volume of their own (a RAID5/6), or --force"
            )
        notes.append(msg)
    saves = ck.saves(steps)
    if saves == 0:
        notes.append(f"--checkpoint-every {ck.every}: no save within the run's {steps} step(s)")
    free = shutil.disk_usage(base).free
    if saves and need * saves > free:
        raise UsageError(
            f"--checkpoint-dir {ck.dir}: {saves} save(s) of about {need / 2**30:.2f} GiB need "
            f"{need * saves / 2**30:.2f} GiB, {free / 2**30:.2f} GiB free",
            hint="free space, save less often (--checkpoint-every), or another folder",
        )
    return notes


def resume_point(path: Path, est: Estimate, optimizer_on_nvme: bool) -> tuple[Path, str]:
    """``--resume-from``: the folder and tag of a checkpoint of this model (DeepSpeed's
    ``latest`` names the tag; or the tag's folder itself). Its copy of the swap files must
    be this model's, to the byte, where the optimizer state is on NVMe."""
    hint = "name the --checkpoint-dir of a run of this model and config"
    if not path.is_dir():
        raise UsageError(f"--resume-from {path} is not a folder", hint=hint)
    latest = path / "latest"
    if latest.is_file():
        load_dir, tag = path, latest.read_text().strip()
    else:
        load_dir, tag = path.parent, path.name
    tag_dir = load_dir / tag
    if not any(tag_dir.glob("*model_states.pt")):
        raise UsageError(f"--resume-from {path} holds no DeepSpeed checkpoint", hint=hint)
    if optimizer_on_nvme:
        copied = sum(f.stat().st_size for f in (tag_dir / OFFLOADED).rglob("*.swp") if f.is_file())
        want = save_volume(est, True).write
        if copied != want:
            raise UsageError(
                f"--resume-from {path} holds no checkpoint of this model: its optimizer state "
                f"is {copied:,} bytes, this model's {want:,}",
                hint=hint,
            )
    return load_dir, tag


def resume_checks(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A resumed run's checks (the worker's ``resume_check`` event at each step the saving
    run also trained) as one: the first that failed, else the first, with every step's
    figures under "steps", "ok" False where any failed, None where none could be checked,
    and the largest relative difference. None where the run did not resume."""
    checks = sorted(
        (e for e in events if e.get("event") == "resume_check"), key=lambda e: int(e["at_step"])
    )
    if not checks:
        return None
    bad = next((c for c in checks if c["ok"] is False), None)
    rec = dict(bad or checks[0])
    rec["steps"] = [
        {k: c.get(k) for k in ("at_step", "loss", "saved_run_loss", "rel_diff", "ok")}
        for c in checks
    ]
    done = [c for c in checks if c["ok"] is not None]
    rec["ok"] = False if bad else (True if done else None)
    if done:
        rec["rel_diff"] = max(float(c["rel_diff"]) for c in done)
    return rec


def resume_note(check: dict[str, Any]) -> str:
    """The run's note on a resumed run's steps against the saving run's losses (the checks
    as one: :func:`resume_checks`). The first resumed step's loss shows the weights came
    back; only a later one shows Adam's state did, and the note says when none was checked."""
    steps = check.get("steps") or [check]
    done = [s for s in steps if s["ok"] is not None]
    if check["ok"] is None or not done:
        return (
            f"resumed: the saving run kept no loss for step {check['at_step']} (it did not train "
            "past the save): the resumed loss is not checked"
        )
    if check["ok"] is False:
        return (
            f"resumed: step {check['at_step']}'s loss {check['loss']:.5f} is not the saving "
            f"run's {check['saved_run_loss']:.5f}"
        )
    first, last = done[0], done[-1]
    if first is not last:
        return (
            f"resumed: steps {first['at_step']}-{last['at_step']}'s losses continue the "
            f"saving run's (largest relative difference {check['rel_diff']:.2g}, at most "
            f"{check['tolerance']:g})"
        )
    return (
        f"resumed: step {first['at_step']}'s loss {first['loss']:.5f} continues the saving "
        f"run's ({first['saved_run_loss']:.5f}, relative difference {check['rel_diff']:.2g}, "
        f"at most {check['tolerance']:g}); only that step was trained by both, which checks "
        "the weights, not the optimizer's state (resume from an earlier save to check that too)"
    )


def resume_io_note(copies: list[dict[str, Any]]) -> str:
    """A resumed run's note on its initialisation's I/O, which the I/O model's (a fresh
    start's) leaves out: the save's swap files copied back into the swap folder (the worker's
    ``resume_copy`` records), and DeepSpeed's reload of the optimizer state through them."""
    moved = sum(int(c.get("bytes") or 0) for c in copies)
    how = ", ".join(sorted({str(c.get("copy")) for c in copies if c.get("copy")}))
    return (
        "resumed: the initialisation's I/O includes the save's swap files copied back into the "
        + (f"swap folder ({moved / 2**30:.3f} GiB by {how})" if how else "swap folder")
        + " and DeepSpeed's reload of the optimizer state through them; the I/O model's "
        "initialisation is a fresh start's"
    )


def _drive_bytes(io: dict[str, Any] | None, drives: tuple[str, ...], op: str) -> int | None:
    if io is None:
        return None
    per = io.get("drives") or {}
    if not drives or not all(d in per for d in drives):
        return None
    return sum(int(per[d][op]) for d in drives)


def save_rows(
    events: list[dict[str, Any]],
    io_steps: list[dict[str, Any]],
    est: Estimate,
    optimizer_on_nvme: bool,
    offload_drives: tuple[str, ...],
    checkpoint_drives: tuple[str, ...],
    array: Array | None = None,
    request_size: int | None = None,
    persist_drives: tuple[str, ...] = (),
    persist_array: Array | None = None,
    persist_request_size: int | None = None,
) -> dict[str, Any] | None:
    """The run's saves beside the I/O model: each save's seconds (the step blocked, until
    durable), what it left on disk, and, traced, what the drives moved in its interval
    (read from the offload volume, written to the checkpoint volume), and on a protected
    checkpoint *array* (level, chunk, members) what parity added. With --checkpoint-persist,
    each save's persist, and, traced, what the persist volume's drives (*persist_drives*,
    on *persist_array*, in the aio copy's *persist_request_size* requests) wrote for it.
    None: no save. Pure."""
    saves = [e for e in events if e.get("event") == "checkpoint"]
    if not saves:
        return None
    by_label = {s["label"]: s for s in io_steps}
    persists = {
        e["tag"]: persist_io(e, io_steps, persist_drives, persist_array, persist_request_size)
        for e in events
        if e.get("event") == "persist"
    }
    rows = []
    for e in saves:
        io = by_label.get(f"checkpoint:{e['step']}")
        written = _drive_bytes(io, checkpoint_drives, "write")
        rows.append(
            {
                "step": e["step"],
                "tag": e.get("tag"),
                "blocked_s": e.get("blocked_s"),
                "durable_s": e.get("durable_s"),
                "files": e.get("files"),
                "bytes": e.get("bytes"),
                "swap_copy_bytes": e.get("swap_copy_bytes"),
                # iotune's copy of the swap files (aio, reflink), durable within the save
                "swap_copy": e.get("swap_copy") or [],
                # --checkpoint-persist: its copy into the persist folder, once durable
                "persist": persists.get(e.get("tag")),
                "read_bytes": None if io is None else io["read"].get("bytes"),
                "write_bytes": None if io is None else io["write"].get("bytes"),
                "offload_read_bytes": _drive_bytes(io, offload_drives, "read"),
                "checkpoint_write_bytes": written,
                # the same, request by request: {exact size in bytes: requests}
                "offload_read_sizes": drive_sizes(io, offload_drives, "read"),
                "checkpoint_write_sizes": drive_sizes(io, checkpoint_drives, "write"),
                "write_gib_s": round(written / 2**30 / e["durable_s"], 3)
                if written is not None and e.get("durable_s")
                else None,
                "parity": parity_traffic(
                    array.level,
                    array.chunk_bytes,
                    {n: io["drives"][n] for n in array.members},
                    int(e.get("bytes") or 0),
                    request_size,
                    asked=(io.get("arrays") or {}).get(array.name, {}).get("write"),
                )
                if array and io and all(n in (io.get("drives") or {}) for n in array.members)
                else None,
            }
        )
    model = save_volume(est, optimizer_on_nvme)
    copy = saves[0].get("copy") or "deepspeed"
    # a reflink save clones the swap files: the file system shares their extents, and the
    # drives move none of their bytes (a save is then its size on disk, not traffic)
    moved = IoVolume(0, 0) if copy == "reflink" and optimizer_on_nvme else model
    return {
        "writer": saves[0].get("writer"),
        # how the swap files were copied: iotune's aio or reflink, or DeepSpeed's copytree
        "copy": copy,
        "saves": rows,
        "estimate": {
            "bytes": model.write,  # a save's size on disk
            "read_bytes": moved.read,  # what the drives read and write for it
            "write_bytes": moved.write,
            "exact": optimizer_on_nvme,
        },
        "offload_drives": list(offload_drives),
        "checkpoint_drives": list(checkpoint_drives),
        **({"persist_drives": list(persist_drives)} if persists else {}),
    }
