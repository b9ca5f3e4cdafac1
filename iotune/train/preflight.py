"""Before a training run: will it fit (GPU memory, host RAM, NVMe space, locked memory), is
its offload directory usable and free (O_DIRECT, no other process's swap files), and
DeepSpeed's ops loaded before the tracer attaches (a compiler's I/O is not the workload's)."""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.checks import fstype, o_direct_error
from iotune.errors import CommandFailed, IotuneError, UsageError
from iotune.model.estimate import Estimate
from iotune.probes.fabrics import refuse_lost
from iotune.probes.sysfs import SysTree
from iotune.proc import command as worker_command
from iotune.proc import worker_env
from iotune.units import GIB

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
        need, have = _apart(self.need, self.have)
        return f"≈ {need} {self.what} {self.where}, found {have}"


def _apart(need: int, have: int | None) -> tuple[str, str]:
    """*need* and *have* in GiB to a tenth, or with the decimals (then MiB, then bytes) that
    tell them apart: a shortfall never reads "needs 0.5 GiB, found 0.5 GiB"."""
    if have is None:
        return f"{need / GIB:.1f} GiB", "none"
    for unit, size in (("GiB", GIB), ("MiB", 2**20)):
        for d in (1, 2, 3):
            a, b = f"{need / size:.{d}f}", f"{have / size:.{d}f}"
            if a != b:
                return f"{a} {unit}", f"{b} {unit}"
    return f"{need:,} bytes", f"{have:,} bytes"


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
    from iotune.checks import probe_torch

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
        kind = fstype(Path(root))
        if kind in NO_DRIVE_FS:
            continue  # a network or memory filesystem: on no drive of this host
        if kind == "overlay" and _overlay_off_drives(tree, root):
            continue  # an overlay whose every layer is on such a filesystem
        try:
            drives |= set(resolve_path(tree, root).disks)
        except (OSError, IotuneError):
            return None
    return drives


def _overlay_off_drives(tree: SysTree, path: str) -> bool:
    """Whether the overlay *path* is on has every layer on a network or memory filesystem
    (a VM's tmpfs-over-9p root, say); False where a layer is on a drive or unknown."""
    from iotune.probes.mounts import mount_of, overlay_layers, read_mounts

    mounts = read_mounts(tree)
    top = mount_of(mounts, os.path.realpath(path))
    if top is None or top.fstype != "overlay":
        return False
    layers = overlay_layers(mounts, top)
    return layers is not None and all(m.fstype in NO_DRIVE_FS for m in layers)


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
    from iotune.errors import last_line

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
    for n, e in report.get("ops", {}).items():
        if e.get("lock"):  # torch's build lock: one a stopped build left, or a build's
            sys.stderr.write(f"iotune: {n.removesuffix('Builder')}: {e['lock']}\n")
    if failed:
        name, entry = next(iter(failed.items()))
        raise IotuneError(
            f"DeepSpeed op {name} did not load: {last_line(entry['error'])}",
            hint="'iotune doctor --for train --build-ops' shows what is missing",
        )
    took = ", ".join(
        f"{n.removesuffix('Builder')} "
        + ("loaded by the zygote" if e.get("cached") else f"{e['seconds']:.1f} s")
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
    refuse_lost(path, "offload directory")
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
