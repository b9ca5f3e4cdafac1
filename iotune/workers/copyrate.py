"""The swap files' copy of a save (:mod:`iotune.workers.swapcopy`) against its ceiling.

The ceiling is the raw O_DIRECT copy between the same two volumes through the same async I/O
op: every byte of the source folder read and as many bytes written to the target, chunk by
chunk, the read and the write of each chunk in flight at once and neither waiting on the
other's data, then each file fsynced. A copy cannot be faster than that: it reads and writes
the same bytes and must also hand each chunk from one to the other.

The source is a swap folder as DeepSpeed leaves it (iotune.sweep.copysweep.swap_files: the
fp32 master and the two Adam moments of each swapped sub-group), written O_DIRECT so that no
page of it is cached (:func:`make_folder`). Measured side by side by
``benchmarks/swapcopy_pairs.py`` and ``iotune sweep-checkpoint --copy-from``.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from iotune.workers.durable import fsync_path, preallocate
from iotune.workers.swapcopy import ALIGN, AioSettings, chunks

#: the ceiling's settings (block, queue depth, threads), the best of which is the ceiling
CEILING = ((1 << 20, 32, 4), (8 << 20, 64, 8))


def _handle(block: int, depth: int, threads: int) -> Any:
    from deepspeed.ops.op_builder import AsyncIOBuilder

    return AsyncIOBuilder().load(verbose=False).aio_handle(block, depth, False, True, threads)


def _locked(handle: Any, size: int) -> Any:
    import torch

    return handle.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))


def make_folder(folder: Path, sizes: list[int], settings: AioSettings | None = None) -> int:
    """Files of *sizes* bytes (each a multiple of ALIGN x the threads) in *folder*, written
    O_DIRECT from a page-locked buffer of random bytes and fsynced: none of their pages in
    the page cache, as DeepSpeed's swapper leaves them. Returns the bytes written."""
    s = (settings or AioSettings()).checked()
    unit = ALIGN * s.intra_op_parallelism
    folder.mkdir(parents=True, exist_ok=True)
    h = _handle(s.block_size, s.queue_depth, s.intra_op_parallelism)
    buf = _locked(h, s.chunk)
    buf.random_(0, 255)
    try:
        for i, size in enumerate(sizes):
            if size % unit:
                raise ValueError(f"file {i}: {size} bytes is not a multiple of {unit}")
            path = folder / f"{i}.tensor.swp"
            with open(path, "wb") as fh:
                preallocate(fh.fileno(), size)
            for off, n in chunks(size, s.chunk):
                if h.pwrite(buf[:n], str(path), False, False, off) < 0:
                    raise OSError(f"the async I/O op could not write {path} at {off}")
            fsync_path(path)
    finally:
        h.free_cpu_locked_tensor(buf)
    return sum(sizes)


def raw_copy(src: Path, dst: Path, block: int, depth: int, threads: int, chunk: int) -> float:
    """Seconds to read every file of *src* and write as many bytes into *dst* (made here,
    each file's blocks allocated first, as the aio copy's), O_DIRECT, each chunk's read and
    write in flight at once, then each written file fsynced."""
    rd, wr = _handle(block, depth, threads), _handle(block, depth, threads)
    bufs = [_locked(rd, chunk), _locked(wr, chunk)]
    dst.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        for f in sorted(p for p in src.iterdir() if p.is_file()):
            out = dst / f.name
            size = f.stat().st_size
            with open(out, "wb") as fh:
                preallocate(fh.fileno(), size)  # as the aio copy does
            for off, n in chunks(size, chunk):
                if rd.pread(bufs[0][:n], str(f), False, True, off) < 0:
                    raise OSError(f"the async I/O op could not read {f} at {off}")
                if wr.pwrite(bufs[1][:n], str(out), False, True, off) < 0:
                    raise OSError(f"the async I/O op could not write {out} at {off}")
                if rd.wait() < 0 or wr.wait() < 0:
                    raise OSError(f"the async I/O op failed on {f} or {out}")
            fsync_path(out)
        return time.perf_counter() - t0
    finally:
        rd.free_cpu_locked_tensor(bufs[0])
        wr.free_cpu_locked_tensor(bufs[1])


def ceiling(src: Path, dst: Path, chunk: int = 64 << 20) -> dict[str, Any]:
    """The raw copy (:func:`raw_copy`) at each of CEILING's settings into a fresh *dst*, the
    page cache dropped before each; the fastest, with every row."""
    total = sum(p.stat().st_size for p in src.iterdir() if p.is_file())
    rows = []
    for block, depth, threads in CEILING:
        drop_caches()
        sec = raw_copy(
            src, dst, block, depth, threads, chunk // (ALIGN * threads) * ALIGN * threads
        )
        shutil.rmtree(dst)
        rows.append(
            {
                "block_size": block,
                "queue_depth": depth,
                "threads": threads,
                "seconds": sec,
                "bytes": total,
                "bw_bytes_s": total / sec,
            }
        )
    best = max(rows, key=lambda r: r["bw_bytes_s"])
    return {**best, "rows": rows}


def drop_caches() -> None:
    """Dirty pages written, then the clean ones dropped: no copy starts with the one before
    it still in memory (root)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
