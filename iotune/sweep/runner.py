"""Runs a sweep: the points measured one after another by a worker process (a fresh one
after a point that failed), every finished point appended to ``points.jsonl`` at once (so
``--resume`` loses at most the point in flight), fio ceilings in ``fio.jsonl``, temporary
data files removed on every exit path."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.checks import fstype, o_direct_error, probe_torch
from iotune.errors import CommandFailed, CommandTimeout, IotuneError, UsageError, last_line
from iotune.probes.fabrics import refuse_lost
from iotune.proc import command, worker_env
from iotune.records import append_record, host_facts, read_records
from iotune.sweep import space as sp
from iotune.sweep.fio import FIO_PREFIX, measure_ceiling
from iotune.sweep.latency import PointLatency
from iotune.workers.aio_point import DATA_PREFIX

log = logging.getLogger("iotune.sweep")

POINTS = "points.jsonl"
CEILINGS = "fio.jsonl"
META = "sweep.json"


@dataclass(frozen=True)
class SweepSpec:
    target: str
    space: sp.Space
    io_size: int
    repeats: int
    strategy: str  # grid | adaptive
    fio: bool
    gpu: bool
    gds: bool
    budget_s: float | None
    point_timeout_s: float
    swap_preset: str | None = None  # also rehearse this preset's optimizer swapping
    swap_rounds: int = 2
    swap_sets: tuple[str, ...] = ()  # --set overrides of swap_preset (its model, its config)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["space"] = asdict(self.space)
        return d

    @staticmethod
    def from_json(d: dict[str, Any]) -> SweepSpec:
        space = sp.Space(**{k: tuple(v) for k, v in d["space"].items()})
        return SweepSpec(**{**d, "space": space, "swap_sets": tuple(d.get("swap_sets", ()))})


def load_spec(path: str) -> SweepSpec:
    """The spec of the sweep recorded in the run directory *path* (for --resume)."""
    run_dir = Path(path)
    if not (run_dir / META).exists():
        raise UsageError(
            f"{path} is not a sweep run directory (no {META})",
            hint="name the --out of an earlier sweep",
        )
    return SweepSpec.from_json(json.loads((run_dir / META).read_text())["spec"])


def check_gpu(spec: SweepSpec) -> None:
    """--gpu/--gds points need a CUDA GPU that torch sees."""
    if spec.gpu and not probe_torch(build=False).get("gpus"):
        raise UsageError(
            "--gpu/--gds need a CUDA GPU, and torch sees none",
            hint="drop --gpu/--gds on this host",
        )


def load_aio_op() -> None:
    """Build (or just load) DeepSpeed's async_io op once, before any point: the first JIT
    build takes minutes, which no point's timeout should pay for."""
    op_probe = probe_torch(build=True, timeout=3600)
    aio_state = op_probe.get("aio") or {}
    if not aio_state.get("loaded"):
        reason = (
            aio_state.get("error")
            or op_probe.get("deepspeed_error")
            or op_probe.get("worker_error")
            or "not compatible"
        )
        raise IotuneError(
            f"DeepSpeed's async_io op is not usable: {reason}",
            hint="'iotune doctor --for sweep' says what is missing",
        )


def check_target(
    target: Path, io_size: int, threads: tuple[int, ...], block_sizes: tuple[int, ...]
) -> None:
    """Bad input is refused before anything runs."""
    for bs in block_sizes:
        if bs % 4096:
            raise UsageError(
                f"block size {bs} is not a multiple of 4K", hint="e.g. --block-size 128K,512K,1M"
            )
    for t in threads:
        if io_size % t:
            raise UsageError(
                f"--io-size {io_size} does not divide by {t} threads",
                hint="DeepSpeed splits the buffer evenly between intra_op_parallelism threads",
            )
    if io_size % 4096:
        raise UsageError(f"--io-size {io_size} is not a multiple of 4K", hint="e.g. --io-size 1G")
    if not target.exists():
        raise UsageError(
            f"target {target} does not exist",
            hint="--target takes a directory on the volume to test",
        )
    if not target.is_dir():
        raise UsageError(
            f"target {target} is not a directory",
            hint="name the directory (mount point) to write in",
        )
    refuse_lost(target, "target")
    fs = fstype(target)
    if fs in ("tmpfs", "ramfs", "devtmpfs", "proc", "sysfs"):
        raise UsageError(
            f"target {target} is on {fs}: RAM, not a drive (and O_DIRECT, which DeepSpeed's "
            "async I/O uses, fails there on kernels before 6.6)",
            hint="pick a directory on the NVMe volume, e.g. the mount point of 'iotune raid create'",
        )
    err = o_direct_error(target)
    if err is not None:
        if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise UsageError(
                f"target {target} is not writable: {os.strerror(err.errno)}",
                hint="pick a directory on a volume mounted read-write",
            )
        raise UsageError(
            f"target {target} ({fs}) does not support O_DIRECT: {os.strerror(err.errno or 0)}",
            hint="DeepSpeed's async I/O opens files with O_DIRECT: use a directory on a drive (xfs, ext4), not tmpfs",
        )
    free = shutil.disk_usage(target).free
    need = int(io_size * 1.1)
    if free < need:
        raise UsageError(
            f"target {target} has {free} bytes free, a point needs {need}",
            hint="lower --io-size or free space",
        )


def run_worker(module: str, payload: dict[str, Any], timeout_s: float, rec: dict[str, Any]) -> None:
    """Run ``python -m module '<payload JSON>'``: its JSON result into *rec* with status
    "ok", or status "timeout"/"failed" with the error (the sweep records it and goes on)."""

    def once() -> dict[str, Any]:
        return proc.run_worker(module, json.dumps(payload), timeout=timeout_s)

    settle(rec, timeout_s, once)


def settle(rec: dict[str, Any], timeout_s: float, answer: Callable[[], dict[str, Any]]) -> None:
    """*answer*'s result into *rec* with status "ok", or "timeout"/"failed" with the error."""
    try:
        rec.update(answer())
        rec["status"] = "ok"
    except CommandTimeout:
        rec["status"], rec["error"] = "timeout", f"no result within {timeout_s:g} s"
    except CommandFailed as exc:
        rec["status"] = "failed"
        rec["error"] = last_line(exc.stderr_tail) or f"exit {exc.returncode}"


def clean_leftovers(target: Path) -> list[str]:
    removed = []
    for f in target.glob(f"{DATA_PREFIX}*.dat"):
        f.unlink(missing_ok=True)
        removed.append(f.name)
    for f in target.glob(f"{FIO_PREFIX}*.dat"):
        f.unlink(missing_ok=True)
        removed.append(f.name)
    return removed


class Sweep:
    def __init__(
        self,
        spec: SweepSpec,
        out: Path,
        on_point: Callable[[dict[str, Any], int, int], None] | None = None,
        latency: PointLatency | None = None,
    ) -> None:
        self.spec = spec
        #: the drives' latency during each point (None: not measured)
        self.latency = latency
        self.out = out
        self.on_point = on_point
        self.records: dict[str, dict[str, Any]] = {}
        self.ceilings: dict[str, dict[str, Any]] = {}
        self.start = time.monotonic()
        self.budget_hit = False
        # imports torch and DeepSpeed once for all points, not once per point
        self.worker = proc.JsonWorker(command("iotune.workers.aio_point"), env=worker_env())

    # ---------------------------------------------------------------- persistence
    def load(self) -> None:
        if (self.out / POINTS).exists():
            for r in read_records(self.out / POINTS):
                self.records[r["key"]] = r
        if (self.out / CEILINGS).exists():
            for r in read_records(self.out / CEILINGS):
                self.ceilings[r["key"]] = r

    def save_meta(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / META).write_text(
            json.dumps({"spec": self.spec.to_json(), "host": host_facts()}, indent=2) + "\n"
        )

    # ---------------------------------------------------------------- measuring
    def run_point(self, p: sp.Point) -> dict[str, Any]:
        s = self.spec
        args = {**p.as_dict(), "target": s.target, "io_size": s.io_size, "gpu": s.gpu, "gds": s.gds}
        rec: dict[str, Any] = {
            "key": p.key(),
            **p.as_dict(),
            "io_size": s.io_size,
            "target": s.target,
            "gpu": s.gpu,
            "gds": s.gds,
        }
        t0 = time.monotonic()
        before = self.latency.snapshot() if self.latency is not None else {}
        try:
            settle(rec, s.point_timeout_s, lambda: self.worker.ask(args, s.point_timeout_s))
            if self.latency is not None:
                self.latency.record(before, rec)
            if s.gpu or s.gds:
                # CUDA and cuFile state never carries to the next point; a crash in their
                # teardown fails the point, as it would have failed its own process
                code = self.worker.close()
                if code != 0 and rec["status"] == "ok":
                    rec["status"] = "failed"
                    rec["error"] = f"the worker exited with code {code} after the point"
            if rec["status"] == "ok" and p.op == "read" and rec.get("page_cache_dropped") is False:
                rec["status"], rec["error"] = (
                    "failed",
                    "page cache still held the file after it was dropped",
                )
        finally:
            clean_leftovers(Path(s.target))
        rec["wall_s"] = round(time.monotonic() - t0, 3)
        rec["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if rec["status"] == "ok" and s.fio:
            ceil = self.ceiling(p.op, p.block_size, p.queue_depth, p.threads)
            if ceil:
                rec["fio_bw_bytes_s"] = ceil["bw_bytes_s"]
                rec["pct_of_fio"] = 100.0 * rec["bw_bytes_s"] / ceil["bw_bytes_s"]
        append_record(self.out / POINTS, rec)
        self.records[p.key()] = rec
        return rec

    def ceiling(self, op: str, bs: int, qd: int, threads: int = 1) -> dict[str, Any] | None:
        """fio at the point's block size with as many requests in flight (threads x queue
        depth: one job per thread), measured once per key."""
        key = f"{op}/bs={bs}/qd={qd}/t={threads}"
        if key not in self.ceilings:
            try:
                res = measure_ceiling(
                    Path(self.spec.target), op, bs, qd, self.spec.io_size, jobs=threads
                )
            except IotuneError as exc:
                log.warning("fio ceiling %s failed: %s", key, exc.message)
                return None
            finally:
                clean_leftovers(Path(self.spec.target))
            rec = {
                "key": key,
                "op": op,
                "block_size": bs,
                "queue_depth": qd,
                "jobs": threads,
                **res,
            }
            append_record(self.out / CEILINGS, rec)
            self.ceilings[key] = rec
        return self.ceilings[key]

    def over_budget(self) -> bool:
        b = self.spec.budget_s
        return b is not None and time.monotonic() - self.start > b

    def measure(self, points: list[sp.Point]) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for p in points:
            rec = self.records.get(p.key())
            if rec is None:
                if self.over_budget():
                    self.budget_hit = True
                    out[p.key()] = None
                    continue
                rec = self.run_point(p)
                if self.on_point:
                    self.on_point(rec, len(self.records), self.expected())
            out[p.key()] = rec["bw_bytes_s"] if rec.get("status") == "ok" else None
        return out

    def expected(self) -> int:
        s = self.spec.space
        if self.spec.strategy == "grid":
            return s.size() + 2
        per_op = sum(len(getattr(s, c)) for c in sp.COORDS) * 2 - len(sp.COORDS) + sp.race_points()
        return per_op * len(s.ops) + 2

    # ---------------------------------------------------------------- the run
    def run(self) -> list[dict[str, Any]]:
        self.save_meta()
        clean_leftovers(Path(self.spec.target))
        gen = (sp.grid if self.spec.strategy == "grid" else sp.adaptive)(
            self.spec.space, self.spec.repeats
        )
        try:
            sp.drive(gen, self.measure)
            self.cross_measure()
        except BaseException:
            self.close(kill=True)  # Ctrl-C, a signal: the point in flight is not waited for
            raise
        self.close()
        return list(self.records.values())

    def close(self, kill: bool = False) -> None:
        """End the points' worker and remove any data file it left."""
        self.worker.close(kill=kill)
        self.worker.release()
        if self.latency is not None:
            self.latency.close()
        clean_leftovers(Path(self.spec.target))

    def cross_measure(self) -> None:
        """Balanced choice needs configurations measured for both ops: measure each op's
        best configuration on the other op where the strategy did not."""
        recs = list(self.records.values())
        if not {"read", "write"} <= set(self.spec.space.ops):
            return
        best = sp.best_per_op(recs)
        measured = sp.by_config(recs)
        extra = []
        for op, other in (("read", "write"), ("write", "read")):
            cfg = sp.config_of(best[op]) if op in best else None
            if cfg is not None and cfg not in measured.get(other, {}):
                extra.append(sp.Point(other, *cfg, repeats=self.spec.repeats, phase="cross"))
        if extra:
            self.measure(extra)
