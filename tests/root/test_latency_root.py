"""Latency and queue depth (`iotune trace`) on real fio jobs, beside bcc's biolatency (its
libbpf build, /usr/sbin/biolatency of Debian's libbpf-tools: issue to completion at the
block layer's own tracepoints, in log2 buckets of microseconds) running at the same time, and
beside fio's own latency and the kernel's time_in_queue.

The loop device reads its file with O_DIRECT, so each request waits for the drive under it
(tens of microseconds and more), and the file is written first (holes would read at once)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from iotune.trace import latency as lt
from tests.root.conftest import IOTUNE, sh
from tests.tools.biolatency import BIOLATENCY, buckets, ours

# a fixed count, not a fixed time: what the job does is the same however loaded the host is
IOS = 3000


@pytest.fixture(scope="module")
def biolatency() -> str:
    if not os.access(BIOLATENCY, os.X_OK):
        pytest.fail(f"{BIOLATENCY} is missing: scripts/setup.sh test installs libbpf-tools")
    return BIOLATENCY


def _drive(loop_device: Callable[..., str]) -> str:
    dev = loop_device(size_mib=256, direct_io=True)
    sh("fio", "--name=fill", f"--filename={dev}", "--rw=write", "--bs=1m", "--direct=1",
       "--ioengine=libaio", "--iodepth=8", "--size=256m")  # fmt: skip
    return dev


def _bytes(bs: str) -> int:
    return int(bs.removesuffix("k")) * 1024


def _job(
    dev: str, rw: str, bs: str, qd: int, engine: str, out: Path, biolatency: str
) -> tuple[dict[str, Any], dict[str, Any], dict[int, int]]:
    """`iotune trace -- fio` with biolatency beside it: (iotune's drive entry, fio's op
    result, biolatency's buckets for the drive)."""
    disk = Path(dev).name
    # line-buffered: its first line says it is attached
    bl = subprocess.Popen(
        ["stdbuf", "-oL", biolatency, "-D", "-d", disk],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert bl.stdout is not None
        ready, _, _ = select.select([bl.stdout], [], [], 60)
        first = bl.stdout.readline() if ready else ""
        assert "Tracing" in first, f"biolatency did not start: {first!r}"
        fio_out = out / "fio.json"
        job = [
            "fio", "--name=job", f"--filename={dev}", f"--rw={rw}", f"--bs={bs}", "--direct=1",
            f"--ioengine={engine}", f"--iodepth={qd}", f"--number_ios={IOS}",
            # past the drive's 256 MiB a sequential job wraps round to its start
            f"--io_size={IOS * _bytes(bs)}",
            "--lat_percentiles=1", "--output-format=json", f"--output={fio_out}",
            # fio's latencies on the kernel's monotonic clock, the tracer's: by default fio
            # times with the TSC at a rate it calibrates in its first milliseconds, which a
            # busy CPU can disturb. Once, beside the vm tier's guests, the tracer's p99 of
            # the 512 KiB reads was 6.8% above fio's, though each request's time is inside
            # fio's wait for it; the clocks are the one suspect not ruled out
            "--clocksource=clock_gettime",
        ]  # fmt: skip
        p = subprocess.run(
            [IOTUNE, "--json", "trace", "--devices", disk, "--out", str(out / "t"), "--", *job],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        time.sleep(0.2)
    finally:
        bl.send_signal(signal.SIGINT)
        text, _ = bl.communicate(timeout=60)
    doc = json.loads(p.stdout)
    entry = next(d for d in doc["devices"] if d["name"] == disk)
    op = "read" if "read" in rw else "write"
    return entry, json.loads(fio_out.read_text())["jobs"][0][op], buckets(text, disk)


@pytest.mark.parametrize(
    ("rw", "bs", "qd", "engine"),
    [
        ("randread", "4k", 1, "psync"),
        ("randread", "4k", 32, "libaio"),
        ("read", "512k", 8, "libaio"),
    ],
)
def test_latency_agrees_with_biolatency_fio_and_the_kernel(
    rw: str,
    bs: str,
    qd: int,
    engine: str,
    loop_device: Callable[..., str],
    tmp_path: Path,
    biolatency: str,
) -> None:
    dev = _drive(loop_device)
    entry, fio, theirs = _job(dev, rw, bs, qd, engine, tmp_path, biolatency)
    # exact, or short by the completions the kernel counted that fired no completion event
    # (6.18 on loop devices under load, a few in 10,000; iotune/trace/model.py): the issues
    # add up, and those requests are never timed, by biolatency either
    unseen = entry["check"]["unseen_completions"]
    assert entry["check"]["exact"] or unseen, entry["check"]["summary"]
    lat = entry["latency"]
    read = lat["read"]
    slots: dict[int, int] = {}
    for cls in lt.CLASSES:
        for k, v in ((read[cls] or {}).get("histogram") or {}).items():
            slots[int(k)] = slots.get(int(k), 0) + v
    # every read timed whose completion fired, as many as biolatency timed
    n = sum(slots.values())
    assert n == read["requests"] == sum(theirs.values())
    assert n + unseen == entry["read"]["requests"] >= IOS
    assert fio["total_ios"] == IOS, fio["total_ios"]
    # a request whose completion did not fire is timed anew when its slot is issued again
    assert lat["depth"]["reissued"] <= unseen and lat["write"] is None
    # bucket by bucket: only the requests of our slots astride a bucket's edge may fall on
    # the other side (and the two programs' clocks read a few hundred ns apart)
    got, edge = ours(slots)
    for b in sorted(set(got) | set(theirs)):
        diff = abs(got.get(b, 0) - theirs.get(b, 0))
        assert diff <= edge.get(b, 0) + 0.01 * n + 2, (b, got, theirs, edge)
    # fio times each I/O from before it is submitted to after it is reaped: the drive's
    # time is inside it
    fio_p = {q: fio["lat_ns"]["percentile"][f"{q:.6f}"] / 1000 for q in (50.0, 99.0)}
    assert read["p50_us"] <= fio_p[50.0] * (1 + lt.REL_ERROR), (read, fio_p)
    assert read["p99_us"] <= fio_p[99.0] * (1 + lt.REL_ERROR), (read, fio_p)
    depth = lat["depth"]
    # each issue counted once at the depth it found, but a slot issued again
    assert depth["at_issue"]["issues"] == entry["read"]["requests"] - depth["reissued"], depth
    # the kernel's time_in_queue counts each request from its start, before issue, to its
    # end: at least the time the tracer counts from issue. How much more is the time a
    # request waits before its issue, which the CPU's load sets (10% to 15% more seen at
    # QD1 on a loop device). Its bound is fio's: each request's kernel time lies inside the
    # time fio waited for it, so over the trace (which holds fio's run) the kernel's mean
    # depth is at most fio's own, IOPS x mean latency (Little's law)
    fio_depth = fio["iops"] * fio["lat_ns"]["mean"] / 1e9
    assert depth["kernel_mean"] >= depth["mean"] * 0.98 - 0.01, depth
    assert depth["kernel_mean"] <= fio_depth * 1.01 + 0.01, (depth, fio_depth)
    if qd == 1:
        # one request at a time: an issue finds itself alone at the drive (but where udev
        # reads the new device beside it, or a completion that fired no event left its
        # request counted in flight until its tag came round again)
        assert depth["at_issue"]["p50"] == 1, depth
        assert depth["at_issue"]["p99"] <= 2 + unseen, depth
    if bs == "512k":
        # the drive is what the job waits for: the requests' time from issue to completion,
        # as timed, is most of the kernel's own count of their time from their start
        # (time_in_queue); the rest is the wait before issue, which a loaded CPU stretches
        # (fio's latency adds its own path on top, within 7% on a quiet 2-core host,
        # benchmarks/latency_agreement.py, but twice the drive's beside the vm tier's guests
        # starting: a bound on it would judge the host's load, not the tracer); the drive
        # never holds more than fio keeps in flight (each 512 KiB read one request), and
        # does hold that many
        assert depth["mean"] >= 0.8 * depth["kernel_mean"], depth
        assert qd <= depth["at_issue"]["max"] <= qd + unseen, depth
        assert entry["read"]["sizes"] == {str(512 * 1024): n + unseen}, entry["read"]["sizes"]


def test_no_latency_counts_sizes_only(loop_device: Callable[..., str], tmp_path: Path) -> None:
    dev = loop_device()
    p = subprocess.run(
        [IOTUNE, "--json", "trace", "--devices", Path(dev).name, "--no-latency",
         "--out", str(tmp_path / "t"), "--", "fio", "--name=job", f"--filename={dev}",
         "--rw=write", "--bs=64k", "--direct=1", "--size=4m", "--output-format=json"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    (entry,) = json.loads(p.stdout)["devices"]
    assert entry["check"]["exact"] and entry["write"]["requests"] == 64
    assert entry["latency"] is None
