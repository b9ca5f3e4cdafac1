"""Worker: one DeepSpeed async-I/O sweep point, in a fresh process.

    python -m iotune.workers.aio_point '<json point>'

Loads the real async_io op, makes an ``aio_handle`` with the point's settings, allocates
the buffer (pinned CPU from ``new_cpu_locked_tensor``; with "gpu" a GPU tensor and the
pinned buffer as bounce; with "gds" a GDS handle on a pinned GPU tensor), then times
``sync_pread``/``sync_pwrite`` of the whole buffer to an O_DIRECT file in the target,
after a warm-up. Before every timed read the page cache is dropped and that is verified
(the file has no resident page). Prints one JSON object on the original stdout; the data
file is removed on every exit path.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import resource
import statistics
import sys
import time
from typing import Any

from iotune.workers import private_stdout

DATA_PREFIX = "iotune-aio-"


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


def drop_caches(path: str) -> int:
    """Drop the page cache and return the bytes of *path* still resident (should be 0)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as fh:
        fh.write("3\n")
    return resident_bytes(path)


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)  # all threads, the AIO workers included
    return ru.ru_utime + ru.ru_stime


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
    host = (
        handle.new_cpu_locked_tensor(io_size, torch.empty(0, dtype=torch.uint8))
        if not p.get("gds")
        else None
    )
    dev = torch.empty(io_size, dtype=torch.uint8, device="cuda") if use_cuda else None
    if p.get("gds"):
        handle.pin_device_tensor(dev)
    io_buf = dev if p.get("gds") else host
    if io_buf is None:
        raise RuntimeError("no I/O buffer")
    io_buf.random_(0, 255)
    seconds: list[float] = []
    cpu: list[float] = []
    resident: list[int] = []
    try:
        if p["op"] == "read":
            handle.sync_pwrite(io_buf, path)
        for i in range(int(p.get("warmup", 1)) + int(p["repeats"])):
            if p["op"] == "read":
                resident.append(drop_caches(path))
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
        if host is not None:
            handle.free_cpu_locked_tensor(host)
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
    }


def main() -> None:
    report = private_stdout()
    point = json.loads(sys.argv[1])
    result = measure(point)
    report.write(json.dumps(result) + "\n")
    report.flush()


if __name__ == "__main__":
    main()
