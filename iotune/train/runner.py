"""One offloaded training run: checks and preflight, the run directory, the training worker
under the tracer, the seed study's table from what both recorded.

Run directory:
    preset.json, ds_config.json, estimate.json, spec.json   what was asked and predicted
    steps.jsonl      the worker's events (init, then one per optimizer step), as they happen
    events.jsonl, samples.jsonl, trace.json ...            the tracer's records (iotune trace)
    run.json, result.csv, result.md                        the table, written on every exit
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.checks import fstype
from iotune.errors import CommandFailed, UsageError
from iotune.model.dsconfig import DEFAULT_AIO_BLOCK, ds_config
from iotune.model.estimate import Estimate, estimate
from iotune.model.presets import Dtype, Preset, resolve_dtype
from iotune.probes.meminfo import mem_available
from iotune.probes.mounts import existing_ancestor
from iotune.probes.sysfs import SysTree
from iotune.proc import command as worker_command
from iotune.proc import worker_env
from iotune.records import to_jsonable
from iotune.trace.targets import Targets
from iotune.trace.writeback import write_back
from iotune.train.checkpoint import TAG, check_folder, resume_point, with_writer
from iotune.train.checkpoint import save_volume as ck_save_volume
from iotune.train.copies import check_copy, check_persist, snapshot_steps
from iotune.train.launch import place
from iotune.train.preflight import (
    SWAP_PREFIX,
    Gpus,
    Refused,
    Resources,
    check_nvme_path,
    gpu_info,
    load_ops,
    ops_for,
    preflight,
    swap_dir_users,
)
from iotune.train.request import Prepared, RunRequest
from iotune.train.results import build_result, write_result
from iotune.units import GIB

# --------------------------------------------------------------------------- the run


def _nvme_paths(req: RunRequest) -> list[Path]:
    """The offload directories, resolved and checked: --nvme-path (one, or one per rank
    round robin) or the preset's."""
    p = req.preset
    raws = list(req.nvme_paths) or ([Path(p.nvme_path)] if p.nvme_path else [])
    if not raws:
        raise UsageError(f"{p.name} offloads to NVMe: say where", hint="--nvme-path /mnt/offload")
    if len(raws) > max(1, p.ranks):
        raise UsageError(
            f"{len(raws)} offload paths for {p.ranks} rank(s) on this node",
            hint="name at most one --nvme-path directory per rank: --nvme-path A,B --ranks 2",
        )
    out = []
    for raw in raws:
        nvme = raw.resolve()
        # the CPU presets' default is a scratch directory that may be created; any other
        # path must already be the mounted volume (never create /mnt/nvme on the root disk)
        default_scratch = not req.nvme_paths and str(raw).startswith("/var/tmp/")  # noqa: S108
        check_nvme_path(nvme, create=default_scratch)
        if nvme in out:
            raise UsageError(f"--nvme-path names {nvme} twice", hint="name each directory once")
        out.append(nvme)
    return out


def _numa_of(tree: SysTree, targets: Any) -> int | None:
    """The NUMA node of the drive(s) behind an offload directory, when they share one."""
    from iotune.probes.blockdev import disk_numa

    nodes = {disk_numa(tree, d) for d in targets.disks}
    return nodes.pop() if len(nodes) == 1 else None


def _volumes(rank_paths: list[Path]) -> tuple[tuple[str, int | None, int], ...]:
    """Each filesystem behind the ranks' offload directories, with the ranks placed on it
    and its free space."""
    by_dev: dict[int, list[Any]] = {}
    for path in rank_paths:
        entry = by_dev.setdefault(os.stat(path).st_dev, [[], shutil.disk_usage(path).free, 0])
        if str(path) not in entry[0]:
            entry[0].append(str(path))
        entry[2] += 1
    return tuple((", ".join(v[0]), v[1], v[2]) for v in by_dev.values())


def prepare(req: RunRequest, tree: SysTree | None = None) -> Prepared:
    """Everything decided before any allocation; raises Refused unless --force."""
    from iotune.trace.targets import Targets, merged, resolve_path

    tree = tree or SysTree("/")
    p = req.preset
    nvmes = _nvme_paths(req) if p.strategy.uses_nvme else []
    nvme = nvmes[0] if nvmes else None
    fs = fstype(nvme) if nvme else None
    if req.out.exists() and any(req.out.iterdir()):
        raise UsageError(
            f"run directory {req.out} is not empty",
            hint="name a new --out directory (a run's records are never mixed with another's)",
        )
    gpus = Gpus(None, None)
    if p.accelerator == "cuda":
        gpus = req.gpu if req.gpu is not None else gpu_info()
    behind = [resolve_path(tree, str(n)) for n in nvmes]  # each directory's drives
    rank_paths, placement = (
        place(nvmes, p.ranks, [_numa_of(tree, t) for t in behind], list(gpus.numa))
        if nvmes
        else ([], "round robin")
    )
    swap_dirs = [n / f"{SWAP_PREFIX}{req.out.name}-{os.getpid()}" for n in rank_paths]
    busy = [u for n in nvmes for u in swap_dir_users(n)]
    if busy and not req.force:
        raise Refused(
            f"the offload directory is in use: {busy[0]}"
            + (f" (and {len(busy) - 1} more)" if len(busy) > 1 else ""),
            hint="wait for that run, or give this one its own --nvme-path (--force runs anyway)",
        )
    req.notes.extend(f"offload directory in use: {u}" for u in busy)
    swap_dir = swap_dirs[0] if swap_dirs else None
    cfg = ds_config(p, str(swap_dir) if swap_dir else None, req.aio)
    est = estimate(p, cfg)
    dtype = resolve_dtype(p)
    if dtype.emulated_bf16:
        req.notes.append(emulated_bf16_note(dtype))
    targets = Targets(disks=())
    raid_level = None
    if behind:
        targets = functools.reduce(merged, behind)
        raid_level = next((a.level for a in targets.arrays if a.level), None)
    cfg, ck_behind, resume = _checkpoints(req, nvmes, est, cfg, tree)
    offload_drives = targets.disks
    if ck_behind is not None:  # the checkpoint volume's drives are traced too
        targets = merged(targets, ck_behind) if targets.disks else ck_behind
    persist_behind = None
    if req.checkpoint is not None and req.checkpoint.persist is not None:
        # and the persist volume's: its copies' writes, and its parity, are measured
        try:
            persist_behind = resolve_path(tree, str(existing_ancestor(req.checkpoint.persist)))
        except UsageError as e:  # a network or memory file system: persisted, not traced
            req.notes.append(f"--checkpoint-persist {req.checkpoint.persist}: not traced ({e})")
        else:
            targets = merged(targets, persist_behind) if targets.disks else persist_behind
    gpu_name, gpu_bytes, gpu_count = gpus.name, gpus.memory, gpus.count
    if p.accelerator == "cuda":
        if gpu_bytes is None and not req.force:
            raise Refused(
                f"{p.name} trains on a CUDA GPU and this host has none that torch can use",
                hint="run a CPU preset (iotune presets list: tiny_*), or --set accelerator=cpu",
            )
        if 0 < gpu_count < p.ranks and not req.force:
            la = req.launch
            if la is not None and la.hosts:
                raise Refused(
                    f"{la.hostfile} gives node {la.node} {p.ranks} slots, a rank each; this "
                    f"host has {gpu_count} GPU(s)",
                    hint=f"'{la.node} slots={gpu_count}' in the hostfile (one rank per GPU)",
                )
            raise Refused(
                f"{p.ranks} ranks need {p.ranks} GPUs; this host has {gpu_count}",
                hint=f"--ranks {gpu_count} or fewer (one rank per GPU)",
            )
    res = Resources(
        gpu_name=gpu_name,
        gpu_bytes=gpu_bytes,
        ram_available=mem_available(),
        nvme_free=shutil.disk_usage(nvme).free if nvme else None,
        nvme_fs=fs,
        raid_level=raid_level,
        gpu_count=gpu_count if p.accelerator == "cuda" else None,
        volumes=_volumes(rank_paths) if rank_paths else (),
    )
    short = preflight(est, res, ", ".join(map(str, nvmes)) or None)
    if p.strategy.raid and raid_level != "raid0":
        short_msg = (
            f"{p.name} expects a RAID0 volume at {nvme}, which is on "
            f"{', '.join(targets.disks) or 'no block device'}"
            + (f" ({raid_level})" if raid_level else "")
        )
        if not req.force:
            raise Refused(
                short_msg,
                hint="build one with 'iotune raid create --all-unused --mount /mnt/offload', pass --nvme-path, or --force",
            )
        req.notes.append(short_msg)
    if short and not req.force:
        raise Refused(
            f"{p.name} needs " + "; ".join(s.describe() for s in short),
            hint="free space or memory, pick a smaller preset, or --force to try anyway",
        )
    req.notes.extend(f"{p.name} needs {s.describe()} (run with --force)" for s in short)
    return Prepared(
        p,
        cfg,
        est,
        res,
        short,
        nvme,
        swap_dir,
        targets,
        nvmes,
        swap_dirs,
        placement,
        dtype,
        resume=resume,
        offload_drives=offload_drives,
        checkpoint_drives=ck_behind.disks if ck_behind is not None else (),
        checkpoint_array=next((a for a in ck_behind.arrays if a.level), None)
        if ck_behind is not None
        else None,
        persist_drives=persist_behind.disks if persist_behind is not None else (),
        persist_array=next((a for a in persist_behind.arrays if a.level), None)
        if persist_behind is not None
        else None,
    )


def _checkpoints(
    req: RunRequest, nvmes: list[Path], est: Estimate, cfg: dict[str, Any], tree: SysTree
) -> tuple[dict[str, Any], Targets | None, tuple[Path, str] | None]:
    """--checkpoint-*: the folder checked (nothing written), the writer in the DeepSpeed
    config, the checkpoint volume's drives; --resume-from: the checkpoint to load."""
    from iotune.trace.targets import resolve_path

    p = req.preset
    on_nvme = p.strategy.optimizer == "nvme"
    ck = req.checkpoint
    behind = None
    if ck is not None:
        ck, cfg, notes = with_writer(ck, cfg)
        req.checkpoint = ck
        req.notes.extend(notes)
        if ck.writer != "torch" and p.accelerator != "cuda":
            # writer_factory.py pins its I/O buffer: torch.Tensor.pin_memory needs a GPU
            req.notes.append(
                f"--checkpoint-writer {ck.writer} on the {p.accelerator}: DeepSpeed's writer, "
                "its buffer page-locked by the aio op (torch's pin_memory needs a GPU)"
                + (
                    "; its writing process forked from the training worker, not spawned"
                    if ck.writer == "decoupled"
                    else ""
                )
            )
        need = ck_save_volume(est, on_nvme).write
        if ck.writer != "torch" and on_nvme:
            req.notes.append(
                f"--checkpoint-writer {ck.writer}: with the optimizer state on NVMe, DeepSpeed's "
                f"save copies the swap files ({need / 2**30:.2f} GiB) with shutil.copytree "
                "whatever the writer; the writer writes only the small pickles beside them"
            )
        persist_notes = check_persist(ck, p.steps, nvmes, need, req.swap_copy)
        steps = snapshot_steps(ck, p.steps)  # with --checkpoint-persist, two at most
        req.notes.extend(check_folder(ck, steps, nvmes, need, req.force, req.swap_copy))
        req.notes.extend(persist_notes)
        folder = ck.dir
        while not folder.exists():
            folder = folder.parent
        behind = resolve_path(tree, str(folder))
    resume = resume_point(req.resume_from, est, on_nvme) if req.resume_from else None
    if req.swap_copy != "deepspeed" and (ck is not None or resume is not None):
        check_copy(req.swap_copy, on_nvme, nvmes, ck.dir if ck else None, resume)
    return cfg, behind, resume


def emulated_bf16_note(dtype: Dtype) -> str:
    """The warning for bf16 forced on a CPU that emulates it, with the cost measured here."""
    cost = None
    with contextlib.suppress(CommandFailed):  # the warning stands without the figure
        cost = proc.run_worker("iotune.workers.torch_probe", "--bf16", timeout=300).get("bf16_cost")
    measured = (
        f"; measured here, a bf16 matmul + backward takes {cost}x float32's time" if cost else ""
    )
    return (
        f"bf16 is {dtype.why.split('bf16 here is ', 1)[-1]}{measured}: "
        "steps will be that much slower than with --set dtype=auto (float32 here)"
    )


def worker_spec(
    p: Preset, cfg: dict[str, Any], run_dir: Path, swap_dirs: list[Path]
) -> dict[str, Any]:
    """What the training worker (iotune.workers.train) reads from its spec.json."""
    return {
        "run_dir": str(run_dir),
        "accelerator": p.accelerator,
        "seed": p.seed,
        "steps": p.steps,
        "micro_batch": p.micro_batch,
        "seq_len": p.seq_len,
        "cpu_threads": p.cpu_threads,
        "gradient_checkpointing": p.gradient_checkpointing,
        "zero_init": p.zero_init,
        "model": p.geometry.model_config(),
        "ds_config": cfg,
        # DeepSpeed's nvme_path for each rank of this node (none without NVMe offload)
        "swap_dirs": [str(d) for d in swap_dirs],
        "data": None,
    }


def run(req: RunRequest, prep: Prepared) -> dict[str, Any]:
    """Run the worker under the tracer; the table is built and written whatever happens."""
    from iotune.trace.request import TraceRequest
    from iotune.trace.runner import Tracer

    out = req.out
    out.mkdir(parents=True, exist_ok=True)
    p = prep.preset
    spec = worker_spec(p, prep.cfg, out, prep.swap_dirs)
    ck = req.checkpoint
    if ck is not None:
        spec["checkpoint"] = {
            "every": ck.every,
            "dir": str(ck.dir),
            "writer": ck.writer,
            "tag": TAG,
            **({"persist": str(ck.persist)} if ck.persist else {}),
        }
    # the swap files' copy, a save's and a resume's
    spec["swap_copy"] = req.swap_copy
    if prep.resume is not None:
        spec["resume"] = {"dir": str(prep.resume[0]), "tag": prep.resume[1]}
    if req.data is not None:
        from iotune.train.data import prepare as prepare_data

        spec["data"] = prepare_data(
            req.data, p.seq_len, p.geometry.vocab_size, out / "data-blocks.npy", req.tokenizer
        )
    for name, obj in (
        ("preset.json", asdict(p)),
        ("ds_config.json", prep.cfg),
        ("estimate.json", asdict(prep.est)),
        ("spec.json", spec),
    ):
        (out / name).write_text(json.dumps(to_jsonable(obj), indent=2) + "\n")
    load_ops(ops_for(prep.cfg, p.accelerator), p.accelerator, out, prep.targets.disks)
    # a first build leaves hundreds of MB of compiler output in the page cache: write it back
    # now, not while the tracer counts the drive it is on (the traced drives' file systems
    # only: sync(2) would also wait on any other, a lost NVMe-oF namespace's for minutes)
    write_back(SysTree("/"), prep.targets.disks, [out, *prep.swap_dirs])
    for d in prep.swap_dirs:
        d.mkdir(parents=True, exist_ok=True)
    if req.launch is not None:
        from iotune.train.launch import launch_command

        command = launch_command(req.launch, out / "spec.json", p.accelerator)
        env = {**worker_env(), "DS_ACCELERATOR": p.accelerator}
    else:
        command = worker_command("iotune.workers.train", str(out / "spec.json"))
        env = worker_env()
    (out / "command.json").write_text(json.dumps(command) + "\n")
    treq = TraceRequest(
        targets=prep.targets,
        backend=req.backend,
        focus=req.focus or int(prep.cfg.get("aio", {}).get("block_size", DEFAULT_AIO_BLOCK)),
        interval=req.interval,
        out=out,
        command=command,
        quiet_stdout=req.quiet_stdout,
        env=env,
        meta={"preset": p.name},
        own_group=True,
        # the steps' rows count the offload volume's drives apart from the checkpoint and
        # persist volumes', whose writes a save's and a persist's rows count
        primary=tuple(prep.offload_drives),
    )
    trace: dict[str, Any] | None = None
    started = time.time()
    try:
        trace = Tracer(treq, on_sample=_progress(req, prep) if req.progress else None).run()
    except KeyboardInterrupt:
        trace = None
    except BaseException:
        _remove_swap(req, prep)
        raise
    try:  # the records first: removing the swap files may wait on the drives
        result = build_result(req, prep, trace, started)
        write_result(out, result)
    finally:
        if not (trace or {}).get("lost_path"):
            # with a path lost, the swap's file system waits on it (ctrl_loss_tmo): left
            _remove_swap(req, prep)
    return result


def _remove_swap(req: RunRequest, prep: Prepared) -> None:
    if not req.keep_swap:
        for d in prep.swap_dirs:
            shutil.rmtree(d, ignore_errors=True)


def _progress(req: RunRequest, prep: Prepared) -> Callable[[Any], None]:
    """A line per training event: how far, how long, and the drives' bytes so far."""
    steps = req.preset.steps
    start: dict[str, Any] = {}
    seen: dict[str, int] = {}

    def show(sample: Any) -> None:
        if not start:
            start.update(sample.stats)
        kind, _, n = sample.label.partition(":")
        if kind not in ("init", "step"):
            return
        # each rank of this node marks the step: say it once, when the last one has
        seen[sample.label] = seen.get(sample.label, 0) + 1
        if seen[sample.label] != req.preset.ranks:
            return
        rd = sum(sample.stats[d].read_bytes - start[d].read_bytes for d in prep.targets.disks)
        wr = sum(sample.stats[d].write_bytes - start[d].write_bytes for d in prep.targets.disks)
        what = "initialised" if kind == "init" else f"step {n}/{steps}"
        io = (
            f", drives read {rd / GIB:.2f} GiB, wrote {wr / GIB:.2f} GiB"
            if prep.targets.disks
            else ""
        )
        sys.stderr.write(f"iotune: {what} at {sample.t:.1f} s{io}\n")
        sys.stderr.flush()

    return show
