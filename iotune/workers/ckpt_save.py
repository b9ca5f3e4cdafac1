"""Worker: one timed checkpoint save of a ZeRO-3 optimizer state (iotune.sweep.ckpt).

    python -m iotune.workers.ckpt_save '<payload JSON>'

payload: ``target`` (the folder), ``params`` (N: the state is 12N bytes of fp32 in
sub-groups of ``sub_group``), ``writer`` (``fast``: DeepSpeed's FastFileWriter with the
knobs of iotune.sweep.ckpt.Knobs; ``torch``: torch.save to a file; ``ceiling``: the aio
handle's own O_DIRECT writes of as many bytes, the best of a few settings), ``verify``
(load the file back and compare it with the state). Prints one JSON object.

With a GPU the writer is built by DeepSpeed's CheckpointWriterFactory, as the fast and
decoupled engines build it (its buffer pinned by CUDA). Without one the factory cannot pin
(torch's pin_memory needs a GPU): the writer is the same FastFileWriter over a buffer that
the aio op locks itself, as DeepSpeed's swapper locks its buffers on a CPU host.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from typing import Any

from iotune.workers import cpu_info_once, die_with_parent, private_stdout
from iotune.workers.fastpersist import WHY, RecordCopy, install

FILE = "iotune-ckpt-{pid}.pt"
#: the ceiling's settings (block, queue depth, threads): those the writer can take
CEILING = ((2**20, 32, 1), (2**20, 32, 4), (8 * 2**20, 32, 4), (8 * 2**20, 128, 8))
MIB = 2**20


def make_state(n: int, sub_group: int) -> dict[str, Any]:
    """ZeRO-3's optimizer state of a rank with *n* parameters, as DeepSpeed saves it: the
    fp32 master in sub-groups and Adam's moments of each. Each tensor holds one value (a
    save writes every byte whatever they are; a load is checked against them)."""
    import torch

    groups, state = [], {}
    for g in range(math.ceil(n / sub_group)):
        m = min(sub_group, n - g * sub_group)
        groups.append(torch.full((m,), float(3 * g + 1)))
        state[g] = {
            "step": torch.tensor(1.0),
            "exp_avg": torch.full((m,), float(3 * g + 2)),
            "exp_avg_sq": torch.full((m,), float(3 * g + 3)),
        }
    return {
        "optimizer_state_dict": {
            "state": state,
            "param_groups": [{"lr": 1e-4, "params": list(state)}],
        },
        "fp32_flat_groups": groups,
    }


def verify(path: str, state: dict[str, Any]) -> bool:
    import torch

    back = torch.load(path, weights_only=True)
    pairs = list(zip(back["fp32_flat_groups"], state["fp32_flat_groups"], strict=True))
    for g, s in state["optimizer_state_dict"]["state"].items():
        b = back["optimizer_state_dict"]["state"][g]
        pairs += [(b["exp_avg"], s["exp_avg"]), (b["exp_avg_sq"], s["exp_avg_sq"])]
    return all(torch.equal(a, b) for a, b in pairs)


def _aio(k: dict[str, Any]) -> Any:
    from deepspeed.ops.op_builder import AsyncIOBuilder

    return (
        AsyncIOBuilder()
        .load(verbose=False)
        .aio_handle(
            int(k["block_size"]),
            int(k["queue_depth"]),
            bool(k["single_submit"]),
            bool(k["overlap_events"]),
            int(k["threads"]),
        )
    )


def _fast_writer(k: dict[str, Any], path: str) -> tuple[Any, Any, str]:
    """(writer, release, how its buffer was pinned): DeepSpeed's own writer factory, as the
    fast and decoupled engines build it (on a CPU host, its buffer locked by the aio op:
    iotune.workers.fastpersist)."""
    import torch
    from deepspeed.runtime.model_checkpointing.data_parallel_writer_factory import (
        DataParallelWriterConfig,
    )
    from deepspeed.runtime.model_checkpointing.writer_factory import CheckpointWriterFactory

    cuda = torch.cuda.is_available()
    if not cuda:
        install()
    factory = CheckpointWriterFactory(
        writer_config={
            "type": "FAST",
            "io_buffer_size": int(k["io_buffer_size"]),
            "io_buffer_double": bool(k["io_buffer_double"]),
            "io_multiplier": 1,
            "show_statistics": False,
        },
        aio_config={
            "block_size": int(k["block_size"]),
            "queue_depth": int(k["queue_depth"]),
            "single_submit": bool(k["single_submit"]),
            "overlap_events": bool(k["overlap_events"]),
            "intra_op_parallelism": int(k["threads"]),
            "use_gds": False,
        },
        dp_writer_config=DataParallelWriterConfig(1, 0, 0, 0, True),
    )
    writer = factory.create_writer(path, False)
    return (
        writer,
        factory.release_writer,
        "pinned by CUDA (DeepSpeed's writer factory)" if cuda else WHY,
    )


def _forget(path: str) -> None:
    """The file gone, and its pages with it."""
    if os.path.exists(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        os.unlink(path)


def save(p: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    import torch

    path = os.path.join(p["target"], FILE.format(pid=os.getpid()))
    out: dict[str, Any] = {}
    try:
        if p["writer"] == "torch":
            t0 = time.perf_counter()
            torch.save(state, path)
            t1 = time.perf_counter()
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            t2 = time.perf_counter()
            out.update(blocked_s=t1 - t0, durable_s=t2 - t0)
        else:
            from deepspeed.io.constants import AIO_FILL_BUFFER_SEC_KEY, AIO_WRITE_SEC_KEY

            crc = getattr(torch.serialization, "set_crc32_options", None)
            if crc is not None:
                crc(bool(p.get("crc32", True)))
            elif not p.get("crc32", True):
                raise RuntimeError(
                    f"torch {torch.__version__} always computes the CRC32 (2.6 can skip it)"
                )
            writer, release, pinned = _fast_writer(p, path)
            copy = RecordCopy(in_place=not p.get("record_copy", True)).install()
            released = False
            try:
                t0 = time.perf_counter()
                torch.save(obj=state, f=writer, _use_new_zipfile_serialization=True)
                release()  # close: the last partial buffer, then fsync
                released = True
                t1 = time.perf_counter()
            finally:
                copy.remove()
                # a save cut short (SIGTERM) still closes its writer before the file goes:
                # its close appends the last partial buffer, which would make the file anew
                if not released:
                    release()
            stats = dict(writer._stats)  # the writer's own timings, the close's included
            out.update(
                blocked_s=t1 - t0,
                durable_s=t1 - t0,
                fill_s=stats.get(AIO_FILL_BUFFER_SEC_KEY),
                aio_write_s=stats.get(AIO_WRITE_SEC_KEY),
                # the writer's copy of each record (or, in place, the view of it)
                copy_s=copy.seconds,
                copy_bytes=copy.copied,
                buffer=pinned,
            )
        out["bytes"] = os.path.getsize(path)
        if p.get("verify"):
            out["verified"] = verify(path, state)
    finally:
        _forget(path)
    return out


def ceiling(p: dict[str, Any], n_bytes: int) -> dict[str, Any]:
    """The volume's own write rate through the aio op: *n_bytes* written O_DIRECT from a
    locked buffer of up to 1 GiB, then fsync, for each of CEILING's settings; the best."""
    import torch

    path = os.path.join(p["target"], FILE.format(pid=os.getpid()))
    size = min(n_bytes, 2**30) // MIB * MIB or MIB
    rows = []
    for bs, qd, t in CEILING:
        k = {
            "block_size": bs,
            "queue_depth": qd,
            "threads": t,
            "single_submit": False,
            "overlap_events": True,
        }
        handle = _aio(k)
        buf = handle.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
        buf.random_(0, 255)
        try:
            t0 = time.perf_counter()
            off = 0
            while off < n_bytes:
                if handle.sync_pwrite(buf, path, off) < 0:
                    raise RuntimeError("aio write failed")
                off += size
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            dt = time.perf_counter() - t0
        finally:
            handle.free_cpu_locked_tensor(buf)
            _forget(path)
        rows.append(
            {
                "block_size": bs,
                "queue_depth": qd,
                "threads": t,
                "bytes": off,
                "bw_bytes_s": off / dt,
            }
        )
    best = max(rows, key=lambda r: r["bw_bytes_s"])
    return {"bw_bytes_s": best["bw_bytes_s"], "best": best, "rows": rows, "source": "aio op"}


def main() -> None:
    report = private_stdout()
    cpu_info_once()
    # a SIGTERM (the sweep interrupted, or iotune's death) unwinds: the file is removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    die_with_parent()
    p = json.loads(sys.argv[1])
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    n = int(p["params"])
    if p["writer"] == "ceiling":
        result = ceiling(p, 12 * n)
    else:
        state = make_state(n, int(p["sub_group"]))
        result = save(p, state)
    report.write(json.dumps(result) + "\n")
    report.flush()


if __name__ == "__main__":
    main()
