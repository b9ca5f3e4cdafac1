"""The target's ceiling, measured by fio with the same block size and the same requests in
flight: as many jobs as the AIO point has threads, each at the point's queue depth over its
own slice of the file, as DeepSpeed's threads split a buffer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from iotune import proc

FIO_PREFIX = "iotune-fio-"


def fio_argv(
    target: Path,
    op: str,
    block_size: int,
    queue_depth: int,
    io_size: int,
    seconds: int,
    jobs: int = 1,
) -> list[str]:
    return [
        "fio",
        f"--name=ceiling-{op}",
        f"--filename={target / f'{FIO_PREFIX}{os.getpid()}.dat'}",
        f"--size={io_size // jobs}",
        f"--offset_increment={io_size // jobs}",
        "--direct=1",
        "--ioengine=libaio",
        f"--rw={op}",
        f"--bs={block_size}",
        f"--iodepth={queue_depth}",
        f"--numjobs={jobs}",
        "--group_reporting",
        "--time_based",
        f"--runtime={seconds}",
        "--ramp_time=1",
        "--unlink=1",
        "--output-format=json",
    ]


def parse_fio_json(text: str, op: str) -> dict[str, Any]:
    """Bandwidth (bytes/s), IOPS and mean completion latency of *op* from fio's JSON."""
    doc = json.loads(text[text.index("{") :])
    job = doc["jobs"][0][op]
    clat = job.get("clat_ns") or {}
    return {
        "bw_bytes_s": float(job["bw_bytes"]),
        "iops": float(job["iops"]),
        "clat_mean_us": float(clat.get("mean", 0.0)) / 1000.0,
        "fio_version": doc.get("fio version"),
    }


def measure_ceiling(
    target: Path,
    op: str,
    block_size: int,
    queue_depth: int,
    io_size: int,
    seconds: int = 3,
    jobs: int = 1,
) -> dict[str, Any]:
    done = proc.run(
        fio_argv(target, op, block_size, queue_depth, io_size, seconds, jobs),
        timeout=seconds * 10 + 120,
    )
    return parse_fio_json(done.stdout, op)
