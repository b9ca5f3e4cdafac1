"""A run's checkpoints, saved from the training worker: DeepSpeed's ``save_checkpoint``
timed (blocked, then durable) and what it left on disk, as one event of the run's record;
the restore of Adam's state that DeepSpeed's load of an NVMe-offloaded optimizer leaves out
(``restore_swapped_adam``); and the proof of a resumed run, that each of its steps the saving
run also trained has the loss the saving run had (LOSSES): the first shows the weights came
back, the later ones the optimizer's state."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol


class _Events(Protocol):
    def emit(self, rec: dict[str, Any]) -> None: ...


#: the step a checkpoint was saved after, in its client state
STEP_KEY = "iotune_step"
#: beside a run's tags in its --checkpoint-dir: the loss of each of its steps by global step
#: (rank 0's), against which a run resumed from one of the saves checks its first step
LOSSES = "iotune-losses.json"
#: how far a resumed step's loss may be from the saving run's, relative: the same state and
#: batch give the same loss (on a CPU to the bit); a GPU's unordered reductions in bf16 move
#: it by far less than 0.1%. A model near its start has a loss near ln(vocabulary) whatever
#: its weights (zeroed ones give ln(V) exactly, 1% from a tiny model's first losses): a
#: looser bound would pass a lost state
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 1e-3}


class RunFails(Exception):
    """The run cannot go on, for a reason the message gives in one line."""


def _read_losses(folder: Path) -> dict[str, float]:
    try:
        doc = json.loads((folder / LOSSES).read_text())
    except (OSError, ValueError):
        return {}
    losses = doc.get("losses") if isinstance(doc, dict) else None
    return {str(k): float(v) for k, v in losses.items()} if isinstance(losses, dict) else {}


class LossLedger:
    """The losses of a run that saves checkpoints, by global step, in LOSSES beside its tags
    (written anew after each step). A run resumed from a save in the same folder keeps the
    saving run's losses and writes its own over them step by step: each of its steps that
    the saving run trained is checked against them first and the run stops at the first
    that differs (StepLosses), so what it writes is the same line of training, and a resume
    that failed leaves the saving run's later losses for the next try."""

    def __init__(self, folder: Path, resumed_from: Path | None) -> None:
        self.path = folder / LOSSES
        self.losses = _read_losses(folder) if resumed_from == folder else {}

    def add(self, global_step: int, loss: float) -> None:
        self.losses[str(global_step)] = loss
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"losses": self.losses}) + "\n")
        os.replace(tmp, self.path)


class StepLosses:
    """Each step's loss, for the runs that save (LossLedger, on rank 0) and, in a resumed
    run, checked at each step the saving run also trained (resume_check: an event each;
    RunFails where one fails). The first resumed step's loss depends on the weights alone;
    the second on the update the first made, so on Adam's moments and step count too."""

    def __init__(self, spec: dict[str, Any], rank: int, resumed: int, dtype: str) -> None:
        ck, resume = spec.get("checkpoint"), spec.get("resume")
        self.resume = resume if resumed and rank == 0 else None
        self.resumed, self.dtype = resumed, dtype
        # the saving run's losses, read before this run's own ledger (in the same folder)
        # writes over the steps after the save
        self.expected = _read_losses(Path(resume["dir"])) if resume and self.resume else {}
        self.ledger = (
            LossLedger(
                Path(ck.get("persist") or ck["dir"]), Path(resume["dir"]) if resume else None
            )
            if ck and rank == 0
            else None
        )

    def add(self, global_step: int, loss: float, events: _Events) -> None:
        # checked before the ledger takes it: a step that fails is not written over the
        # saving run's loss for it
        if self.resume is not None and (
            global_step == self.resumed + 1 or str(global_step) in self.expected
        ):
            check = resume_check(self.resume, global_step, loss, self.dtype, self.expected)
            events.emit(check)
            if check["ok"] is False:
                raise RunFails(check["message"])
        if self.ledger is not None:
            self.ledger.add(global_step, loss)


def resume_check(
    resume: dict[str, Any],
    global_step: int,
    loss: float,
    dtype: str,
    losses: dict[str, float] | None = None,
) -> dict[str, Any]:
    """A step of a run resumed from ``resume`` (its folder and tag) against the loss the
    saving run had at the same global step (*losses*, else its folder's LOSSES now): the
    event of the check, "ok" False (and the message) where the two differ by more than the
    dtype's tolerance."""
    folder = Path(resume["dir"])
    expected = (_read_losses(folder) if losses is None else losses).get(str(global_step))
    rec: dict[str, Any] = {
        "event": "resume_check",
        "at_step": global_step,
        "loss": loss,
        "saved_run_loss": expected,
        "tolerance": LOSS_TOLERANCE[dtype],
        "ok": None,
    }
    if expected is None:
        return rec  # the saving run did not train past this save, or kept no ledger
    rel = abs(loss - expected) / max(abs(expected), 1e-12)
    rec.update(rel_diff=rel, ok=bool(rel <= rec["tolerance"]) and not math.isnan(loss))
    if not rec["ok"]:
        rec["message"] = (
            f"the run resumed from {folder / str(resume['tag'])} does not continue its loss: "
            f"step {global_step} gave {loss:.5f}, the saving run {expected:.5f} (relative "
            f"difference {rel:.2g}, at most {rec['tolerance']:g} in {dtype})"
        )
    return rec


def restore_swapped_adam(engine: Any, load_dir: str, tag: str | None = None) -> int | None:
    """Adam's state of a ZeRO-3 optimizer on NVMe, put back after ``load_checkpoint``.

    DeepSpeed's load copies the checkpoint's swap files (the fp32 master and both moments)
    back into the swap folder, but where the optimizer is on NVMe it skips the optimizer's
    own state (runtime/engine.py: no ``_load_zero_checkpoint`` where
    ``zero_nvme_offload_optimizer()``). The master reaches the model; the moments and the
    step count do not: CPU Adam starts over at the next step (zero moments, step 1) and
    overwrites the copied moment files, so the resumed run's second step is not the saving
    run's. The skipped load also puts back each parameter group's settings (a scheduler's
    lr) and the fp32 master of sub-groups too small to swap (kept in memory, saved in the
    pickle). Here all of it comes back from the checkpoint's optimizer states
    (``*_optim_states.pt``): the groups' settings, each small sub-group's master (and the
    model's weights from it, as DeepSpeed's reset does), each sub-group's step count, and
    each moment kept on NVMe registered with the swapper as an empty tensor named as its
    file (the swapper's ``state_name-ds_id``), so that the next swap-in reads it from the
    copied file; no moment of those is held in memory here. A checkpoint whose sub-groups
    are not this run's is refused in one line (RunFails). *tag* as given to
    ``load_checkpoint`` (None: the one *load_dir*'s ``latest`` names). The number of
    sub-groups restored; None where the optimizer is not on NVMe (DeepSpeed loads its state
    itself)."""
    import torch

    opt = engine.optimizer
    swapper = getattr(opt, "optimizer_swapper", None)
    if swapper is None or not engine.zero_nvme_offload_optimizer():
        return None
    if tag is None:
        tag = (Path(load_dir) / "latest").read_text().strip()
    whole = torch.load(
        engine._get_zero_ckpt_name(load_dir, tag), map_location="cpu", weights_only=False
    )["optimizer_state_dict"]
    saved, flat = whole["optimizer_state_dict"], whole.get("fp32_flat_groups") or []
    inner = opt.optimizer
    n = 0
    for g, group in enumerate(saved["param_groups"]):
        # the group's settings as saved (a scheduler's lr among them): the load that is
        # skipped is also the one that puts them back
        inner.param_groups[g].update({k: v for k, v in group.items() if k != "params"})
        subs = [s for s in range(len(opt.fp16_groups)) if opt.sub_group_to_group_id[s] == g]
        if len(subs) != len(group["params"]):
            raise RunFails(
                f"the checkpoint in {load_dir}/{tag} holds {len(group['params'])} optimizer "
                f"sub-group(s) in parameter group {g}, this run {len(subs)}: it was saved by "
                "another model, ZeRO sub_group_size or number of ranks"
            )
        for sub, idx in zip(subs, group["params"], strict=True):
            param = opt.fp32_partitioned_groups_flat[sub]
            info = swapper.swap_params_info.get(param.ds_id)
            if info is None and sub < len(flat) and flat[sub].numel() == param.numel():
                # too small to swap: its fp32 master stayed in memory and was saved in the
                # pickle, which the load skips; back, and into the model's weights
                param.data.copy_(flat[sub])
                opt._reassign_or_swap_out_partitioned_parameters(sub)
            state = saved["state"].get(idx)
            if not state:
                continue  # no step taken before the save
            kept: dict[str, Any] = {}
            on_nvme = []
            for name, value in state.items():
                # swapped out when saved: empty in the pickle (the pipelined swapper leaves
                # its reused buffer there), its bytes in the copied file
                if info is not None and torch.is_tensor(value) and value.dim() > 0:
                    t: Any = torch.empty(0, dtype=value.dtype)
                    t.ds_id = f"{name}-{param.ds_id}"  # the swapper's name for its file
                    on_nvme.append(t)
                    kept[name] = t
                else:
                    kept[name] = value
            if on_nvme:  # (only a swapped sub-group's: info is its swap record)
                info.tensors = info.tensors[:1]
                info.add_state_tensors(on_nvme)
            inner.state[param] = kept
            n += 1
    return n


def resume(
    engine: Any, at: dict[str, Any] | None, copy: str | None, aio: dict[str, Any] | None
) -> tuple[int, list[Any], int | None]:
    """DeepSpeed's ``load_checkpoint`` of *at* (its folder and tag; None: a fresh start), the
    checkpoint's swap files copied back into this run's swap folder by *copy*, then Adam's
    state that the load leaves out on NVMe (:func:`restore_swapped_adam`): the global step
    the save was taken after, the copy's records, the sub-groups restored."""
    if not at:
        return 0, [], None
    from iotune.workers.swapcopy import copies

    with copies(copy, aio) as made:
        _path, client = engine.load_checkpoint(at["dir"], tag=at["tag"])
    step = int((client or {}).get(STEP_KEY, 0))
    tag = None if at.get("tag") is None else str(at["tag"])
    return step, list(made), restore_swapped_adam(engine, at["dir"], tag)


def save_checkpoint(
    engine: Any,
    ck: dict[str, Any],
    global_step: int,
    step: int,
    events: _Events,
    acc: Any,
    persister: Any = None,
) -> None:
    """DeepSpeed's save_checkpoint into ck["dir"], tagged by the step: the seconds the step
    was blocked, the seconds until its files were durable (fsync'd; for the decoupled writer
    after its process committed them), and what it holds; its event ends its own interval in
    the trace, after the step's. With ck["persist"], the save is a snapshot that *persister*
    (local rank 0's, iotune.workers.persist) copies there once every rank has sealed it,
    and the save first waits for the copy of the one before (persist_wait_s, apart)."""
    from iotune.workers.durable import seal
    from iotune.workers.swapcopy import copies

    tag = str(ck["tag"]).format(global_step)
    before = persister.wait() if persister is not None else None
    if before is not None:
        events.emit(before)  # the wait: an interval of the trace of its own, before the save's
    acc.synchronize()
    t0 = time.perf_counter()
    with copies(ck.get("copy"), ck.get("aio")) as made:
        # latest only once the tag folder is durable, below
        engine.save_checkpoint(
            ck["dir"], tag=tag, client_state={STEP_KEY: global_step}, save_latest=False
        )
    acc.synchronize()
    t1 = time.perf_counter()
    if ck["writer"] == "decoupled":
        engine._commit_decoupled_checkpoint()
    # a snapshot's latest is the persist folder's, written once the copy there is durable
    held = seal(Path(ck["dir"]), tag, latest=engine.global_rank == 0 and not ck.get("persist"))
    t2 = time.perf_counter()
    events.emit(
        {
            "event": "checkpoint",
            "step": step,
            "global_step": global_step,
            "tag": tag,
            "writer": ck["writer"],
            "copy": ck.get("copy") or "deepspeed",
            # the swap files' copy by iotune, durable within the save (aio, reflink)
            "swap_copy": [r.as_dict() for r in made],
            "blocked_s": round(t1 - t0, 4),
            "durable_s": round(t2 - t0, 4),
            # the wait for the last save's persist, before blocked_s
            **({"persist_wait_s": before["waited_s"]} if before is not None else {}),
            **held,
        }
    )
    if ck.get("persist"):
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            import deepspeed.comm as ds_comm

            ds_comm.barrier()  # every rank's files of the tag sealed before the copy reads them
        if persister is not None:
            persister.start(tag, step)
