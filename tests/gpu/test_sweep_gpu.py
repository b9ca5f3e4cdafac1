"""gpu tier: `iotune sweep-aio --gpu` (GPU tensor, pinned bounce buffer) with the real DeepSpeed
async_io op on the GPU machine. `--gds` is not covered: the GPU machines have no nvidia-fs, so
every GDS point fails there (benchmarks/results/gpu-sweep-aio-h100.txt records that)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from typing import Any

ARGS = [
    "--block-size",
    "1M",
    "--queue-depth",
    "8,32",
    "--threads",
    "1",
    "--single-submit",
    "false",
    "--overlap-events",
    "true",
    "--ops",
    "read,write",
    "--io-size",
    "256M",
    "--repeats",
    "2",
    "--strategy",
    "grid",
    "--no-fio",
]


def sweep(*extra: str) -> tuple[int, dict[str, Any], str]:
    target = tempfile.mkdtemp(dir="/var/tmp", prefix="iotune-gpu-sweep-")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "iotune",
            "--json",
            "sweep-aio",
            "--target",
            target,
            *ARGS,
            "--out",
            f"{target}-run",
            *extra,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=1500,
    )
    return p.returncode, (json.loads(p.stdout) if p.stdout.strip() else {}), p.stderr


def test_gpu_buffer_sweep() -> None:
    code, doc, err = sweep("--gpu")
    assert code == 0, err[-3000:]
    assert doc["ok"] == 4 and doc["failed"] == 0
    for op in ("read", "write"):
        best = doc["best"][op]
        assert best["gpu"] is True and best["bw_bytes_s"] > 0
    assert doc["best"]["read"]["page_cache_dropped"] is True
