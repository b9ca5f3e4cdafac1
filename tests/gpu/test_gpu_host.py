"""gpu tier (a GPU machine, not CI): doctor sees the GPU through a real torch worker, and the
probes work on that machine's own disks.

    python3 -m pytest -m gpu tests/gpu
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest


def iotune_json(*args: str) -> Any:
    p = subprocess.run(
        [sys.executable, "-m", "iotune", "--json", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def doctor() -> dict[str, Any]:
    return {c["name"]: c for c in iotune_json("doctor")["checks"]}


def test_doctor_reports_the_gpu_with_its_memory(doctor: dict[str, Any]) -> None:
    import torch

    assert torch.cuda.is_available(), "the gpu tier runs on a machine with a CUDA GPU"
    gpu = doctor["GPU"]
    assert gpu["status"] == "PASS"
    name = torch.cuda.get_device_properties(0).name
    gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    assert f"{name} ({gib:.1f} GiB)" in gpu["found"]
    assert gpu["found"].startswith(f"CUDA {torch.version.cuda}")
    assert doctor["torch"]["status"] == "PASS"


def test_devices_and_diskstats_trace_on_the_gpu_host() -> None:
    if os.geteuid() != 0:
        pytest.fail("run the gpu tier as root")
    disks = iotune_json("devices", "--all")["devices"]
    assert disks, "no disk found"
    root = [d for d in disks if any(r["kind"] == "root" for r in d["in_use"])]
    assert root, [d["name"] for d in disks]
    doc = iotune_json(
        "trace",
        "--backend",
        "diskstats",
        "--devices",
        root[0]["name"],
        "--duration",
        "1",
        "--out",
        "/tmp/iotune-gpu-trace",
    )
    assert doc["backend"] == "diskstats"
    assert doc["devices"][0]["name"] == root[0]["name"]
