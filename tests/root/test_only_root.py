"""`iotune trace --pid` and `--cgroup` on a drive two processes write at once: only the one
named is counted, by its exact sizes, with both eBPF backends; bad input is one line."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.root.conftest import IOTUNE

#: each writer waits this long before its I/O: the tracer attaches meanwhile
WAIT_S = 6


def _writer(
    dev: str, bs: str, count: int, seek: int, cgroup: Path | None = None
) -> subprocess.Popen[bytes]:
    """A shell that (joins *cgroup* and) sleeps, then becomes dd (exec: the same pid) writing
    *count* blocks of *bs* with O_DIRECT."""
    join = f"echo $$ > {cgroup}/cgroup.procs; " if cgroup else ""
    script = (
        f"{join}sleep {WAIT_S}; exec dd if=/dev/zero of={dev} bs={bs} count={count} "
        f"seek={seek} oflag=direct status=none"
    )
    return subprocess.Popen(["sh", "-c", script])


def _trace(dev: str, tmp: Path, *args: str) -> dict[str, Any]:
    p = subprocess.run(
        [IOTUNE, "--json", "trace", "--devices", Path(dev).name, "--duration", str(WAIT_S + 6),
         "--out", str(tmp / "t"), *args],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    doc: dict[str, Any] = json.loads(p.stdout)
    return doc


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A new cgroup v2 under the cgroup2 mount (/sys/fs/cgroup, or .../unified on a hybrid
    host)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    roots = [Path(m.split()[1]) for m in mounts if m.split()[2:3] == ["cgroup2"]]
    if not roots:
        pytest.fail("no cgroup v2 hierarchy mounted")
    cg = roots[0] / f"iotune-test-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    yield cg
    for _ in range(50):  # its processes have exited
        try:
            cg.rmdir()
            break
        except OSError:
            time.sleep(0.1)


def _only_mine(doc: dict[str, Any], dev: str) -> None:
    (entry,) = [d for d in doc["devices"] if d["name"] == Path(dev).name]
    # 64 writes of 64 KiB counted, the other writer's 128 KiB ones not at all
    assert entry["write"]["sizes"] == {str(64 * 1024): 64}, entry["write"]["sizes"]
    assert entry["check"]["exact"] is None
    assert "writes 64 of the drive's" in entry["check"]["summary"], entry["check"]
    assert entry["diskstats"]["write_ios"] >= 64 + 32
    lat = entry["latency"]
    assert lat["write"]["requests"] == 64 and lat["depth"]["at_issue"]["issues"] == 64


@pytest.mark.parametrize("backend", ["libbpf", "bcc"])
def test_pid_counts_that_process_alone(
    backend: str, loop_device: Callable[..., str], tmp_path: Path
) -> None:
    dev = loop_device()
    mine = _writer(dev, "64k", 64, 0)
    other = _writer(dev, "128k", 32, 64)
    try:
        doc = _trace(dev, tmp_path, "--backend", backend, "--pid", str(mine.pid))
    finally:
        assert mine.wait(timeout=60) == 0 and other.wait(timeout=60) == 0
    assert doc["only"] == {"pid": mine.pid} and doc["backend"] == backend
    _only_mine(doc, dev)


def test_cgroup_counts_its_processes_alone(
    loop_device: Callable[..., str], tmp_path: Path, cgroup: Path
) -> None:
    dev = loop_device()
    mine = _writer(dev, "64k", 64, 0, cgroup)
    other = _writer(dev, "128k", 32, 64)
    try:
        doc = _trace(dev, tmp_path, "--cgroup", str(cgroup))
    finally:
        assert mine.wait(timeout=60) == 0 and other.wait(timeout=60) == 0
    assert doc["only"] == {"cgroup": str(cgroup)}
    _only_mine(doc, dev)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--pid", "999999999"], "--pid 999999999: no such process"),
        (["--cgroup", "/tmp"], "--cgroup /tmp: not a cgroup v2 directory"),
        (["--pid", "1", "--cgroup", "/sys/fs/cgroup"], "--pid and --cgroup are two filters"),
        (["--run", "tiny_opt_nvme", "--pid", "1"], "not of --run"),
    ],
    ids=["no-process", "not-a-cgroup", "both", "run"],
)
def test_bad_filters_are_one_line(args: list[str], says: str) -> None:
    p = subprocess.run(
        [IOTUNE, "trace", "--devices", "loop0", "--duration", "1", *args],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert says in p.stderr and "Traceback" not in p.stderr, p.stderr
