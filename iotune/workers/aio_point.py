"""Worker: DeepSpeed async-I/O sweep points, one after another in one process.

    python -m iotune.workers.aio_point        (one JSON point per stdin line)

Loads the real async_io op once. For each point it makes an ``aio_handle`` with the
point's settings and times ``sync_pread``/``sync_pwrite`` of the whole buffer to an
O_DIRECT file in the target, after a warm-up; before every timed read the page cache is
dropped and that is verified (the file has no resident page). The buffer (pinned CPU from
``new_cpu_locked_tensor``; with "gpu" a GPU tensor and the pinned buffer as bounce; with
"gds" a GDS handle on a pinned GPU tensor) is allocated once per I/O size and kept. One
JSON result per point on the original stdout; the data file is removed on every exit
path. A point that fails ends the process (the sweep records it and starts a fresh one).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import resource
import signal
import statistics
import sys
import time
from typing import Any

from iotune.workers import cpu_info_once, die_with_parent, private_stdout

DATA_PREFIX = "iotune-aio-"
MIB = 1 << 20


def resident_bytes(path: str) -> int:
    """Bytes of *path* in the page cache, by mincore(2) over a read-only mapping (what
    util-linux's fincore does; not every distribution ships fincore)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(v & 1 for v in vec) * page
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_file_cache(path: str) -> int:
    """Drop *path*'s pages from the page cache (written back first) and return its bytes
    still resident (should be 0). The file's own: a global sync and drop_caches would also
    wait on every other file system, a lost NVMe-oF namespace's for minutes."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return resident_bytes(path)


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)  # all threads, the AIO workers included
    return ru.ru_utime + ru.ru_stime


class Buffers:
    """The point's buffers, allocated once per I/O size and kind and reused by the points
    after it: a pinned CPU buffer (locked by a handle kept for that, as DeepSpeed's swapper
    keeps its pinned buffers across swaps) and, with "gpu"/"gds", a GPU tensor."""

    def __init__(self) -> None:
        self.key: tuple[int, bool] | None = None
        self.owner: Any = None  # the aio_handle that locked the host buffer
        self.host: Any = None
        self.dev: Any = None

    def get(self, io_size: int, use_cuda: bool, gds: bool) -> tuple[Any, Any]:
        """(host, dev) for a point: host is None for GDS (its handle pins the GPU tensor),
        dev is None without "gpu"/"gds"."""
        import torch

        if self.key != (io_size, use_cuda):
            self.free()
            from deepspeed.ops.op_builder import AsyncIOBuilder

            # the smallest handle: it only owns the lock on the buffer
            self.owner = AsyncIOBuilder().load(verbose=False).aio_handle(MIB, 1, False, False, 1)
            self.host = self.owner.new_cpu_locked_tensor(io_size, torch.empty(0, dtype=torch.uint8))
            self.host.random_(0, 255)
            if use_cuda:
                self.dev = torch.empty(io_size, dtype=torch.uint8, device="cuda")
                self.dev.copy_(self.host)
            self.key = (io_size, use_cuda)
        return (None if gds else self.host), self.dev

    def free(self) -> None:
        if self.owner is not None and self.host is not None:
            self.owner.free_cpu_locked_tensor(self.host)
        self.key = self.owner = self.host = self.dev = None


BUFFERS = Buffers()


def direct(handle: Any, buffer: Any) -> bool:
    """Whether *handle* reads and writes *buffer* without a bounce copy: torch-pinned, or
    locked by DeepSpeed's pinned-buffer registry as this handle sees it (one per process
    in DeepSpeed 0.19; a handle without ``is_pinned`` is taken to have its own)."""
    check = getattr(handle, "is_pinned", None)
    return bool(check(buffer)) if check is not None else False


def measure(p: dict[str, Any]) -> dict[str, Any]:
    import torch

    use_cuda = bool(p.get("gpu") or p.get("gds"))
    if not use_cuda:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.op_builder import AsyncIOBuilder

    io_size = int(p["io_size"])
    path = os.path.join(p["target"], f"{DATA_PREFIX}{os.getpid()}.dat")
    args = (
        int(p["block_size"]),
        int(p["queue_depth"]),
        bool(p["single_submit"]),
        bool(p["overlap_events"]),
        int(p["threads"]),
    )
    if p.get("gds"):
        from deepspeed.ops.op_builder import GDSBuilder

        handle = GDSBuilder().load(verbose=False).gds_handle(*args)
    else:
        handle = AsyncIOBuilder().load(verbose=False).aio_handle(*args)
    host, dev = BUFFERS.get(io_size, use_cuda, bool(p.get("gds")))
    own = None
    if host is not None and not direct(handle, host):
        # a DeepSpeed whose handles each keep their own pinned-buffer registry would copy
        # through a bounce buffer: this point locks its own
        own = handle.new_cpu_locked_tensor(io_size, torch.empty(0, dtype=torch.uint8))
        own.copy_(host)
        host = own
    if p.get("gds"):
        handle.pin_device_tensor(dev)
    io_buf = dev if p.get("gds") else host
    if io_buf is None:
        raise RuntimeError("no I/O buffer")
    seconds: list[float] = []
    cpu: list[float] = []
    resident: list[int] = []
    try:
        if p["op"] == "read":
            handle.sync_pwrite(io_buf, path)
        for i in range(int(p.get("warmup", 1)) + int(p["repeats"])):
            if p["op"] == "read":
                resident.append(drop_file_cache(path))
            c0, t0 = cpu_seconds(), time.perf_counter()
            if p["op"] == "read":
                done = handle.sync_pread(io_buf, path)
                if p.get("gpu") and dev is not None and host is not None:
                    dev.copy_(host, non_blocking=True)
                    torch.cuda.synchronize()
            else:
                if p.get("gpu") and dev is not None and host is not None:
                    host.copy_(dev, non_blocking=True)
                    torch.cuda.synchronize()
                done = handle.sync_pwrite(io_buf, path)
            t1, c1 = time.perf_counter(), cpu_seconds()
            if done < 0:
                raise RuntimeError(f"aio returned {done}")
            if i >= int(p.get("warmup", 1)):
                seconds.append(t1 - t0)
                cpu.append(c1 - c0)
    finally:
        if os.path.exists(path):
            os.unlink(path)
        if p.get("gds"):
            handle.unpin_device_tensor(dev)
        if own is not None:
            handle.free_cpu_locked_tensor(own)
    bw = [io_size / s for s in seconds]
    med = statistics.median(seconds)
    blocks = max(1, io_size // int(p["block_size"]))
    return {
        "bw_bytes_s": io_size / med,
        "bw_bytes_s_all": bw,
        "bw_min": min(bw),
        "bw_max": max(bw),
        "bw_stdev": statistics.pstdev(bw) if len(bw) > 1 else 0.0,
        "seconds": seconds,
        # the mean interval between completed blocks, and Little's law for the
        # per-request latency with queue_depth x threads requests in flight
        "block_interval_us": med / blocks * 1e6,
        "est_latency_us": med / blocks * int(p["queue_depth"]) * int(p["threads"]) * 1e6,
        "cpu_seconds": statistics.median(cpu),
        "cpu_cores": statistics.median(cpu) / med,
        "resident_after_drop": max(resident) if resident else None,
        "page_cache_dropped": all(r == 0 for r in resident) if resident else None,
        "buffer": "per point" if own is not None else "kept",
        "worker_pid": os.getpid(),
    }


def main() -> None:
    report = private_stdout()
    cpu_info_once()
    # a SIGTERM (the sweep's end, or iotune's death) unwinds: the data file is removed
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    die_with_parent()
    for line in sys.stdin:
        if line.strip():
            report.write(json.dumps(measure(json.loads(line))) + "\n")
            report.flush()


if __name__ == "__main__":
    main()
