"""One offloaded training run: checks and preflight, the run directory, the training worker
under the tracer, the seed study's table from what both recorded.

Run directory:
    preset.json, ds_config.json, estimate.json, spec.json   what was asked and predicted
    steps.jsonl      the worker's events (init, then one per optimizer step), as they happen
    events.jsonl, samples.jsonl, trace.json ...            the tracer's records (iotune trace)
    run.json, result.csv, result.md                        the table, written on every exit
"""

from __future__ import annotations

import csv
import functools
import itertools
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.errors import CommandFailed, IotuneError, UsageError
from iotune.probes.meminfo import mem_available
from iotune.probes.sysfs import SysTree
from iotune.records import read_records, to_jsonable
from iotune.sweep.runner import fstype, o_direct_error
from iotune.train.estimate import Estimate, IoVolume, estimate
from iotune.train.launch import Launch, place
from iotune.train.predict import AdamRate, Bandwidth, Baseline, predict
from iotune.train.presets import Dtype, Preset, ds_config, resolve_dtype
from iotune.units import GIB
from iotune.workers import command as worker_command
from iotune.workers import worker_env

SWAP_PREFIX = "iotune-swap-"


class Refused(IotuneError):
    """Preflight: the run would not fit on this host."""


@dataclass(frozen=True)
class Resources:
    """What this host offers the run (None: not known / not applicable)."""

    gpu_name: str | None
    gpu_bytes: int | None
    ram_available: int
    nvme_free: int | None
    nvme_fs: str | None = None
    raid_level: str | None = None  # md level behind the NVMe path, if any
    gpu_count: int | None = None
    # each filesystem behind the offload paths: (paths, free bytes, ranks placed on it)
    volumes: tuple[tuple[str, int | None, int], ...] = ()


@dataclass(frozen=True)
class Shortfall:
    what: str
    need: int
    have: int | None
    where: str

    def describe(self) -> str:
        have = "none" if self.have is None else f"{self.have / GIB:.1f} GiB"
        return f"≈ {self.need / GIB:.1f} GiB {self.what} {self.where}, found {have}"


def preflight(est: Estimate, res: Resources, nvme_path: str | None) -> list[Shortfall]:
    """Every resource the estimate says will not fit. Pure.

    Each filesystem behind the offload paths must hold the files of the ranks placed on it;
    the host's RAM all ranks' processes; each GPU one rank."""
    out = []
    if est.nvme_bytes:
        volumes = res.volumes or ((nvme_path or "?", res.nvme_free, est.ranks),)
        for where, free, ranks in volumes:
            mine = est.nvme_bytes * ranks // max(1, est.ranks)
            need = int(mine * 1.02) + 64 * 2**20  # files are padded; keep some slack
            if free is None or need > free:
                out.append(Shortfall("free", need, free, f"at {where}"))
    if est.gpu_bytes is not None and (res.gpu_bytes is None or est.gpu_bytes > res.gpu_bytes):
        out.append(
            Shortfall(
                "of GPU memory", est.gpu_bytes, res.gpu_bytes, f"on {res.gpu_name or 'a CUDA GPU'}"
            )
        )
    if est.host_bytes > res.ram_available:
        what = "of host RAM" + (f" ({est.ranks} ranks)" if est.ranks > 1 else "")
        out.append(Shortfall(what, est.host_bytes, res.ram_available, "available"))
    return out


# --------------------------------------------------------------------------- host facts


@dataclass(frozen=True)
class Gpus:
    """The GPUs torch sees: GPU 0's name and memory, how many, each one's NUMA node."""

    name: str | None
    memory: int | None
    count: int = 0
    numa: tuple[int | None, ...] = ()


def gpu_info() -> Gpus:
    """The GPUs, from doctor's torch probe worker (no torch import here)."""
    from iotune.doctor import probe_torch

    gpus = probe_torch(build=False, timeout=300).get("gpus") or []
    if not gpus:
        return Gpus(None, None)
    return Gpus(
        str(gpus[0]["name"]),
        int(gpus[0]["memory_bytes"]),
        len(gpus),
        tuple(g.get("numa_node") for g in gpus),
    )


def swap_dir_users(path: Path) -> list[str]:
    """Who else is swapping under *path*: another iotune run's live swap directory there
    (its I/O would be counted as this run's), or a process holding one of DeepSpeed's swap
    files open under it (its ``zero_stage_3`` folders: DeepSpeed runs sharing one swap folder
    overwrite each other's files, "buffer nbytes != file bytes"). Other files open there
    (a dataset on the same volume) are not swapping. One line each; empty when free."""
    out = []
    if path.is_dir():
        for d in sorted(path.glob(f"{SWAP_PREFIX}*")):
            _, _, pid = d.name.rpartition("-")
            if pid.isdigit() and Path(f"/proc/{pid}").exists():
                out.append(f"iotune run {pid} swaps in {d}")
    root = str(path).rstrip("/") + "/"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fds = list((entry / "fd").iterdir())
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith(root) and "zero_stage_3" in target[len(root) :].split("/"):
                out.append(f"{comm} (pid {entry.name}) has {target} open")
                break
    return out


def ops_for(cfg: dict[str, Any], accelerator: str) -> list[str]:
    """The DeepSpeed op builders a run with this config loads at start-up, each of which is a
    JIT build (minutes, with its own disk I/O) when its cache is cold. Pure.

    deepspeed/comm/torch.py builds ShareMemCommBuilder on the cpu accelerator at
    init_distributed; DeepSpeedCPUAdam (ops/adam/cpu_adam.py) and ZenFlow's
    (runtime/zenflow/zenflow_utils.py) load CPUAdamBuilder; the swappers in
    runtime/swap_tensor/ load AsyncIOBuilder for any NVMe offload."""
    zo = cfg.get("zero_optimization", {})
    devices = {
        str(zo.get(k, {}).get("device", "none")) for k in ("offload_optimizer", "offload_param")
    }
    ops = []
    if accelerator == "cpu":
        ops.append("ShareMemCommBuilder")
    if devices & {"cpu", "nvme"} or "zenflow" in zo:
        ops.append("CPUAdamBuilder")
    if "nvme" in devices:
        ops.append("AsyncIOBuilder")
    return ops


#: filesystems whose files lie on no block device of this host
NO_DRIVE_FS = frozenset({"9p", "virtiofs", "nfs", "nfs4", "cifs", "smb3", "tmpfs", "ramfs"})


def code_drives(tree: SysTree | None = None) -> set[str] | None:
    """The drives the training worker's code (its packages, the op cache) lies on; None
    where a folder of it lies on a filesystem this host names no drive for."""
    from iotune.trace.targets import resolve_path
    from iotune.workers.torch_probe import code_roots

    tree = tree or SysTree("/")
    ext = {**os.environ, **worker_env()}.get("TORCH_EXTENSIONS_DIR")
    drives: set[str] = set()
    for root in code_roots(ext):
        if fstype(Path(root)) in NO_DRIVE_FS:
            continue  # a network or memory filesystem: on no drive of this host
        try:
            drives |= set(resolve_path(tree, root).disks)
        except (OSError, IotuneError):
            return None
    return drives


def code_on(disks: tuple[str, ...], tree: SysTree | None = None) -> bool:
    """Whether the training worker's code may lie on one of *disks*: True unless every
    folder of it is known to be elsewhere."""
    drives = code_drives(tree)
    return drives is None or bool(drives & set(disks))


def load_ops(
    ops: list[str], accelerator: str, out: Path, disks: tuple[str, ...] | None = None
) -> dict[str, Any]:
    """Build and load the run's ops in a worker before the tracer attaches, so a first run's
    compiler I/O is never counted as the training's, and read the code the run will execute
    into the page cache where it lies on a traced drive (*disks*; None: warm it anyway).
    Writes ops.json; raises if an op fails."""
    if ops:
        sys.stderr.write(
            f"iotune: loading DeepSpeed ops ({', '.join(ops)}) before tracing; "
            "a first build takes minutes\n"
        )
    sys.stderr.flush()
    from iotune import proc
    from iotune.errors import CommandFailed, last_line

    t0 = time.monotonic()
    warm = disks is None or code_on(disks)
    argv = worker_command(
        "iotune.workers.torch_probe",
        "--prepare",
        "--ops",
        ",".join(ops),
        *([] if warm else ["--no-warm"]),
    )
    try:
        done = proc.run([*argv, "--accelerator", accelerator], timeout=3600, env=worker_env())
        report = proc.worker_json(done)
    except CommandFailed as exc:
        raise IotuneError(
            f"loading DeepSpeed's ops failed: {exc.message}",
            hint="'iotune doctor --for train --build-ops' shows what is missing",
        ) from exc
    report["seconds"] = round(time.monotonic() - t0, 3)
    (out / "ops.json").write_text(json.dumps(report, indent=2) + "\n")
    failed = {n: e for n, e in report.get("ops", {}).items() if e.get("error")}
    if failed:
        name, entry = next(iter(failed.items()))
        raise IotuneError(
            f"DeepSpeed op {name} did not load: {last_line(entry['error'])}",
            hint="'iotune doctor --for train --build-ops' shows what is missing",
        )
    took = ", ".join(
        f"{n.removesuffix('Builder')} {e['seconds']:.1f} s"
        for n, e in report.get("ops", {}).items()
        if e.get("loaded")
    )
    warmed = report.get("warmed") or {}
    code = (
        f"{warmed.get('bytes', 0) / GIB:.1f} GiB of code in the page cache"
        if warm
        else "the code is on no traced drive"
    )
    sys.stderr.write(
        f"iotune: {'ops ready (' + took + '), ' if took else ''}{code}; "
        f"{report['seconds']:.1f} s before tracing\n"
    )
    sys.stderr.flush()
    return report


def check_nvme_path(path: Path, create: bool) -> str:
    """The offload directory exists (or may be made), is on a drive, and takes O_DIRECT."""
    if not path.exists():
        if not create:
            raise UsageError(
                f"offload directory {path} does not exist",
                hint="mount an NVMe filesystem there ('iotune raid create --mount'), or pass --nvme-path DIR",
            )
        path.mkdir(parents=True, exist_ok=True)
    if not path.is_dir():
        raise UsageError(
            f"--nvme-path {path} is not a directory", hint="name a directory on the drive"
        )
    fs = fstype(path)
    if fs in ("tmpfs", "ramfs", "devtmpfs", "proc", "sysfs", "overlay"):
        raise UsageError(
            f"offload directory {path} is on {fs}, not on a drive",
            hint="DeepSpeed swaps with O_DIRECT to a drive: use a directory on an NVMe filesystem (xfs, ext4)",
        )
    err = o_direct_error(path)
    if err is not None:
        raise UsageError(
            f"cannot create an O_DIRECT file in {path}: {os.strerror(err.errno or 0)}",
            hint="DeepSpeed's async I/O needs a writable directory on a filesystem with O_DIRECT",
        )
    return fs


# --------------------------------------------------------------------------- the run


@dataclass
class RunRequest:
    preset: Preset
    out: Path
    backend: str  # "bcc" | "diskstats"
    nvme_paths: list[Path] = field(default_factory=list)  # none: the preset's
    aio: dict[str, Any] | None = None
    aio_source: str = "preset"
    data: Path | None = None
    tokenizer: Path | None = None
    force: bool = False
    keep_swap: bool = False
    quiet_stdout: bool = False
    interval: float = 1.0
    focus: int | None = None  # counted apart; default: the aio block size
    progress: bool = False  # a line on stderr at initialisation and after every step
    notes: list[str] = field(default_factory=list)
    # step-time prediction: measured AIO bandwidth, CPU Adam rate, a baseline's fwd+bwd
    bandwidth: Bandwidth | None = None
    adam: AdamRate | None = None
    baseline: Baseline | None = None
    gpu: Gpus | None = None  # the GPUs, when already probed
    launch: Launch | None = None  # several ranks or nodes: DeepSpeed's launcher


@dataclass
class Prepared:
    preset: Preset
    cfg: dict[str, Any]
    est: Estimate
    res: Resources
    shortfalls: list[Shortfall]
    nvme_path: Path | None
    swap_dir: Path | None
    targets: Any
    nvme_paths: list[Path] = field(default_factory=list)  # the offload directories given
    swap_dirs: list[Path] = field(default_factory=list)  # one per rank of this node
    placement: str = "round robin"  # how ranks were given directories: or "numa"
    dtype: Dtype | None = None  # the model's dtype and why


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
    gpu_name, gpu_bytes, gpu_count = gpus.name, gpus.memory, gpus.count
    if p.accelerator == "cuda":
        if gpu_bytes is None and not req.force:
            raise Refused(
                f"{p.name} trains on a CUDA GPU and this host has none that torch can use",
                hint="run a CPU preset (iotune presets list: tiny_*), or --set accelerator=cpu",
            )
        if 0 < gpu_count < p.ranks and not req.force:
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
        p, cfg, est, res, short, nvme, swap_dir, targets, nvmes, swap_dirs, placement, dtype
    )


def emulated_bf16_note(dtype: Dtype) -> str:
    """The warning for bf16 forced on a CPU that emulates it, with the cost measured here."""
    cost = None
    try:
        done = proc.run(
            worker_command("iotune.workers.torch_probe", "--bf16"),
            timeout=300,
            env=worker_env(),
        )
        cost = proc.worker_json(done).get("bf16_cost")
    except CommandFailed:
        pass  # the warning stands without the figure
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
        "model": p.geometry.llama_config(),
        "ds_config": cfg,
        # DeepSpeed's nvme_path for each rank of this node (none without NVMe offload)
        "swap_dirs": [str(d) for d in swap_dirs],
        "data": None,
    }


def run(req: RunRequest, prep: Prepared) -> dict[str, Any]:
    """Run the worker under the tracer; the table is built and written whatever happens."""
    from iotune.trace.runner import Tracer, TraceRequest

    out = req.out
    out.mkdir(parents=True, exist_ok=True)
    p = prep.preset
    spec = worker_spec(p, prep.cfg, out, prep.swap_dirs)
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
    # now, not while the tracer counts the drive it is on
    os.sync()
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
        focus=req.focus or int(prep.cfg.get("aio", {}).get("block_size", 524288)),
        interval=req.interval,
        out=out,
        command=command,
        quiet_stdout=req.quiet_stdout,
        env=env,
        meta={"preset": p.name},
        own_group=True,
    )
    trace: dict[str, Any] | None = None
    started = time.time()
    try:
        trace = Tracer(treq, on_sample=_progress(req, prep) if req.progress else None).run()
    except KeyboardInterrupt:
        trace = None
    finally:
        if not req.keep_swap:
            for d in prep.swap_dirs:
                shutil.rmtree(d, ignore_errors=True)
    result = build_result(req, prep, trace, started)
    write_result(out, result)
    return result


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


# --------------------------------------------------------------------------- the table


def _row(
    case: str, io: dict[str, Any] | None, nvme: int | None, step: dict[str, Any] | None
) -> dict[str, Any]:
    r = (io or {}).get("read", {})
    w = (io or {}).get("write", {})
    return {
        "case": case,
        # GiB, as the study's tables mean by "GB" (its 16B figures fit 16N/12N/24N only so)
        "nvme_gib": None if nvme is None else round(nvme / GIB, 4),
        "read_gib": None if io is None else round(r.get("bytes", 0) / GIB, 4),
        "write_gib": None if io is None else round(w.get("bytes", 0) / GIB, 4),
        "step_s": None if step is None else step.get("step_s"),
        "optimizer_s": None if step is None else step.get("optimizer_s"),
        "read_focus": r.get("focus_requests"),
        "write_focus": w.get("focus_requests"),
        "read_other": r.get("other_requests"),
        "write_other": w.get("other_requests"),
        "read_bytes": r.get("bytes"),
        "write_bytes": w.get("bytes"),
    }


def _combine_io(rows: list[dict[str, Any]], how: Callable[[list[int]], float]) -> dict[str, Any]:
    """Per-step I/O figures combined field by field (sum over the first row's steps, median
    over later steps); a field some step lacks (diskstats backend: no sizes) stays None."""
    out: dict[str, Any] = {}
    for op in ("read", "write"):
        acc: dict[str, Any] = {}
        for k in ("bytes", "requests", "focus_requests", "other_requests", "diskstats_bytes"):
            vals = [r[op].get(k) for r in rows]
            acc[k] = None if any(v is None for v in vals) else int(how(vals))
        out[op] = acc
    return out


def _est_io(v: IoVolume) -> dict[str, Any]:
    return {"read": {"bytes": v.read}, "write": {"bytes": v.write}}


def _study(p: Preset) -> dict[str, Any] | None:
    from iotune.train.study import study_row

    row = study_row(p)
    return asdict(row) if row else None


def _host_ram(est: Estimate, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Measured peak RSS (VmHWM, what an OOM kill sees) beside the estimate's peak."""
    peaks = [int(e["host_rss_peak_bytes"]) for e in events if e.get("host_rss_peak_bytes")]
    nows = [int(e["host_rss_bytes"]) for e in events if e.get("host_rss_bytes")]
    ready = next((e for e in events if e.get("event") == "ready"), None)
    per_rank: dict[int, int] = {}
    for e in events:
        for r in e.get("ranks", []):
            if r.get("host_rss_peak_bytes"):
                per_rank[r["rank"]] = max(per_rank.get(r["rank"], 0), r["host_rss_peak_bytes"])
    return {
        "ranks": est.ranks,
        "estimate_peak": est.host_bytes,
        "estimate_steady": est.host.steady * est.ranks if est.host else None,
        "estimate_peak_per_rank": est.host.peak if est.host else None,
        "measured_peak_per_rank": {str(k): v for k, v in sorted(per_rank.items())} or None,
        "measured_peak": max(peaks) if peaks else None,
        "measured_last": nows[-1] if nows else None,
        "measured_process": int(ready["host_rss_bytes"])
        if ready and ready.get("host_rss_bytes")
        else None,
        "ratio": round(max(peaks) / est.host_bytes, 3) if peaks and est.host_bytes else None,
    }


def _update_window(steps: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The last complete update interval among the steps (ZenFlow updates at step k, 2k, ...),
    or nothing when steps run one update each."""
    if k <= 1:
        return []
    by = {int(s["step"]): s for s in steps}
    last = max((n for n in by if n % k == 0), default=0)
    window = [by.get(n) for n in range(last - k + 1, last + 1)] if last else []
    return [s for s in window if s] if all(window) else []


def _prediction(req: RunRequest, prep: Prepared, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Predicted optimizer and step time beside the measured steady step."""
    pred = predict(prep.preset, prep.est, req.bandwidth, req.adam, req.baseline)
    steady = next((r for r in rows if r["case"].startswith("steady")), None)
    measured = {
        "optimizer_s": steady["optimizer_s"] if steady else None,
        "step_s": steady["step_s"] if steady else None,
    }
    return {
        **pred.to_json(),
        "measured": measured,
        "bandwidth": asdict(req.bandwidth) if req.bandwidth else None,
        "adam": asdict(req.adam) if req.adam else None,
        "baseline": asdict(req.baseline) if req.baseline else None,
    }


_SLOWEST = ("forward_s", "backward_s", "accumulate_s", "optimizer_s", "step_s", "init_s")
_SUMMED = ("host_rss_bytes", "host_rss_peak_bytes", "tokens_per_s")


def merge_ranks(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per event and step from every rank's: times are the slowest rank's (a
    ZeRO step waits for the last rank in its collectives), host memory and tokens/s the
    node's sum, GPU memory the largest device's, swap files the sum of each rank's own,
    and "ranks" keeps each rank's figures. A single rank's records come back as they are.
    Pure."""
    groups: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((str(r.get("event")), r.get("step")), []).append(r)
    out = []
    for recs in groups.values():
        if len(recs) == 1:
            out.append(recs[0])
            continue
        recs.sort(key=lambda r: int(r.get("rank", 0)))
        m = dict(recs[0])
        for k in _SLOWEST:
            if all(k in r for r in recs):
                m[k] = max(r[k] for r in recs)
        for k in _SUMMED:
            if all(r.get(k) is not None for r in recs):
                m[k] = round(sum(r[k] for r in recs), 2)
        if all(r.get("peak_accel_bytes") is not None for r in recs):
            m["peak_accel_bytes"] = max(r["peak_accel_bytes"] for r in recs)
        if "loss" in m:
            m["loss"] = round(statistics.mean(r["loss"] for r in recs), 5)
        if all(r.get("proc_io") for r in recs):
            m["proc_io"] = {
                k: sum(int(r["proc_io"].get(k, 0)) for r in recs)
                for k in ("read_bytes", "write_bytes")
            }
        if all("swap" in r for r in recs):
            m["swap"] = {
                k: sum(int(r["swap"].get(k, 0)) for r in recs)
                for k in ("allocated", "apparent", "files")
            }
        m.pop("rank", None)
        m["ranks"] = [
            {
                k: r.get(k)
                for k in (
                    "rank",
                    "node",
                    *_SLOWEST,
                    "host_rss_peak_bytes",
                    "peak_accel_bytes",
                    "swap_dir",
                    "proc_io",
                )
                if k in r
            }
            | ({"swap_allocated": r["swap"].get("allocated")} if "swap" in r else {})
            for r in recs
        ]
        out.append(m)
    return out


def per_rank(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rank's steady step (median over the steps after the first; the first when there
    is only one), its own storage I/O per steady step (from its /proc/PID/io), peak host RSS
    and swap files. Pure."""
    every: dict[int, list[dict[str, Any]]] = {}
    for s in steps:
        for r in s.get("ranks", []):
            every.setdefault(int(r["rank"]), []).append(r)
    out = []
    for rank, allr in sorted(every.items()):
        recs = allr[1:] or allr
        io = [
            (a["proc_io"], b["proc_io"])
            for a, b in itertools.pairwise(allr)
            if a.get("proc_io") and b.get("proc_io")
        ]
        moved = {
            f"{op}_bytes_per_step": int(
                statistics.median(b[f"{op}_bytes"] - a[f"{op}_bytes"] for a, b in io)
            )
            if io
            else None
            for op in ("read", "write")
        }
        out.append(
            {
                "rank": rank,
                "node": recs[0].get("node"),
                "step_s": round(statistics.median(r["step_s"] for r in recs), 4),
                "optimizer_s": round(statistics.median(r["optimizer_s"] for r in recs), 4),
                "host_rss_peak_bytes": max((r.get("host_rss_peak_bytes") or 0) for r in allr),
                "peak_accel_bytes": max((r.get("peak_accel_bytes") or 0) for r in allr) or None,
                "swap_allocated": max((r.get("swap_allocated") or 0) for r in allr),
                "swap_dir": recs[0].get("swap_dir"),
                **moved,
            }
        )
    return out


def per_drive(io_steps: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each traced drive's bytes per steady step (median over the steps after the first)
    and its rate over the step's time, from the kernel's counters. Pure."""
    later = steps[1:] or steps
    by_label = {s["label"]: s for s in io_steps}
    rows = [by_label.get(f"step:{s['step']}") for s in later]
    if not rows or not all(r and r.get("drives") for r in rows):
        return []
    step_s = statistics.median(s["step_s"] for s in later)
    out = []
    for d in rows[0]["drives"]:  # type: ignore[index]
        rd = statistics.median(r["drives"][d]["read"] for r in rows)  # type: ignore[index]
        wr = statistics.median(r["drives"][d]["write"] for r in rows)  # type: ignore[index]
        out.append(
            {
                "drive": d,
                "read_bytes": int(rd),
                "write_bytes": int(wr),
                "read_gib_s": round(rd / GIB / step_s, 3) if step_s else None,
                "write_gib_s": round(wr / GIB / step_s, 3) if step_s else None,
            }
        )
    return out


def build_result(
    req: RunRequest, prep: Prepared, trace: dict[str, Any] | None, started: float
) -> dict[str, Any]:
    out = req.out
    every = list(read_records(out / "steps.jsonl")) if (out / "steps.jsonl").exists() else []
    # what stopped a failed worker (rank N: its exception), for the record and the message
    errors = [
        f"rank {e['rank']}: {e['error']}" if e.get("rank") else e["error"]
        for e in every
        if e.get("event") == "error"
    ]
    every = merge_ranks(every)
    # the table's rows: initialisation and the optimizer steps ("ready" only marks where the
    # training's own I/O starts)
    events = [e for e in every if "step" in e]
    ready = next((e for e in every if e.get("event") == "ready"), None)
    steps = [e for e in events if e.get("event") == "step"]
    init = next((e for e in events if e.get("event") == "init"), None)
    io_by_label = {s["label"]: s for s in (trace or {}).get("steps", [])}
    traced = bool(prep.targets.disks) and trace is not None
    footprint = max((e.get("swap", {}).get("allocated", 0) for e in events), default=0)
    nvme = footprint if prep.swap_dir else None
    rows = []
    first_io = None
    if init and steps and traced and "init:0" in io_by_label and "step:1" in io_by_label:
        first_io = _combine_io([io_by_label["init:0"], io_by_label["step:1"]], sum)
    if steps:
        rows.append(_row("init + first step", first_io, nvme, steps[0]))
    later = steps[1:]
    if later:
        later_io = [
            io_by_label[f"step:{s['step']}"] for s in later if f"step:{s['step']}" in io_by_label
        ]
        med_step = {
            "step_s": round(statistics.median(s["step_s"] for s in later), 4),
            "optimizer_s": round(statistics.median(s["optimizer_s"] for s in later), 4),
        }
        rows.append(
            _row(
                f"steady step (median of {len(later)})",
                _combine_io(later_io, statistics.median)
                if traced and len(later_io) == len(later)
                else None,
                nvme,
                med_step,
            )
        )
    est = prep.est
    est_rows = [
        _row("estimate: init + first step", _est_io(est.init_first), est.nvme_bytes, None),
        _row("estimate: steady step", _est_io(est.steady_step), est.nvme_bytes, None),
    ]
    k = est.update_interval
    window = _update_window(steps, k)
    if window:
        # ZenFlow: the median step hides the update step; the mean over one interval does not
        first_interval = window[-1]["step"] == k
        w_io = [io_by_label.get(f"step:{s['step']}") for s in window]
        mean_step = {
            "step_s": round(statistics.mean(s["step_s"] for s in window), 4),
            "optimizer_s": round(statistics.mean(s["optimizer_s"] for s in window), 4),
        }
        rows.append(
            _row(
                f"mean of steps {window[0]['step']}-{window[-1]['step']} (one update interval)",
                _combine_io([x for x in w_io if x], statistics.mean)
                if traced and all(w_io)
                else None,
                nvme,
                mean_step,
            )
        )
        mean_est = est.interval_mean(first_interval)
        if mean_est is not None:
            est_rows.append(
                _row(
                    f"estimate: mean of {'the first' if first_interval else 'an'} update interval",
                    _est_io(mean_est),
                    est.nvme_bytes,
                    None,
                )
            )
    p = prep.preset
    prediction = _prediction(req, prep, rows)
    checks = []
    for d in (trace or {}).get("devices", []):
        if d.get("check"):
            checks.append({"device": d["name"], **d["check"]})
    return {
        "preset": p.name,
        "strategy": p.strategy.name,
        "size": p.size,
        "params": p.geometry.param_count(),
        "geometry": p.geometry.llama_config(),
        "ga": p.ga,
        "micro_batch": p.micro_batch,
        "seq_len": p.seq_len,
        "steps_requested": p.steps,
        "steps_done": len(steps),
        "accelerator": p.accelerator,
        "dtype": to_jsonable(asdict(prep.dtype)) if prep.dtype else None,
        "torch_cpu": ready.get("cpu") if ready else None,
        "nvme_path": str(prep.nvme_path) if prep.nvme_path else None,
        "swap_dir": str(prep.swap_dir) if prep.swap_dir else None,
        "nvme_paths": [str(x) for x in prep.nvme_paths],
        "swap_dirs": [str(x) for x in prep.swap_dirs],
        "placement": prep.placement if len(prep.nvme_paths) > 1 else None,
        "ranks": p.ranks,
        "nodes": p.nodes,
        "world": p.world,
        "node": req.launch.node if req.launch else None,
        "per_rank": per_rank(steps),
        "per_drive": per_drive((trace or {}).get("steps", []), steps),
        "drives": list(prep.targets.disks),
        "aio": prep.cfg.get("aio"),
        "aio_source": req.aio_source,
        "backend": req.backend if prep.targets.disks else None,
        "focus_size": req.focus or int(prep.cfg.get("aio", {}).get("block_size", 524288)),
        "init_s": init.get("init_s") if init else None,
        "footprint": {"allocated": footprint, "estimate": est.nvme_bytes}
        if prep.swap_dir
        else None,
        "table": rows,
        "estimate_table": est_rows,
        "estimate": to_jsonable(asdict(est)),
        "resources": to_jsonable(asdict(prep.res)),
        "events": events,
        "import_s": ready.get("import_s") if ready else None,
        "study": _study(p),
        "prediction": prediction,
        "host_ram": _host_ram(est, [*([ready] if ready else []), *events]),
        "io_steps": (trace or {}).get("steps", []),
        "diskstats_check": checks,
        "dropped": (trace or {}).get("dropped"),
        "other_io": (trace or {}).get("other_io"),
        "notes": req.notes,
        "interrupted": (trace or {}).get("interrupted", "SIGINT" if trace is None else None),
        "exit_code": (trace or {}).get("exit_code"),
        "error": "; ".join(errors) or None,
        "wall_s": round(time.time() - started, 2),
        "out": str(out),
    }


COLUMNS = (
    ("case", "Case"),
    ("nvme_gib", "Space on NVMe, GiB"),
    ("read_gib", "Read, GiB"),
    ("write_gib", "Write, GiB"),
    ("step_s", "Total step time, s"),
    ("optimizer_s", "Optimizer step time, s"),
    ("read_focus", "R, {f}"),
    ("write_focus", "W, {f}"),
    ("read_other", "R, Other"),
    ("write_other", "W, Other"),
)


def write_result(out: Path, result: dict[str, Any]) -> None:
    from iotune.units import binary_size

    tmp = out / "run.json.tmp"
    tmp.write_text(json.dumps(to_jsonable(result), indent=2) + "\n")
    tmp.replace(out / "run.json")
    f = binary_size(result["focus_size"])
    heads = [h.format(f=f) for _, h in COLUMNS]
    rows = [
        {**r, "case": f"{result['preset']}: {r['case']}"}
        for r in result["table"] + result["estimate_table"]
    ]
    with (out / "result.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(heads)
        for r in rows:
            w.writerow(["" if r[k] is None else r[k] for k, _ in COLUMNS])
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        lines.append(
            "| " + " | ".join("" if r[k] is None else str(r[k]) for k, _ in COLUMNS) + " |"
        )
    (out / "result.md").write_text(
        "GiB = 2^30 bytes (the study's tables say GB and mean GiB); request counts are block "
        "requests issued to the drives.\n\n" + "\n".join(lines) + "\n"
    )
