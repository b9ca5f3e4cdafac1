"""Latency and depth from `iotune trace` against bcc's biolatency, fio and the kernel, each fio
job measured by all of them at once.

    sudo .venv/bin/python benchmarks/latency_agreement.py [--seconds 3] [--rounds 3]

Jobs (issue 46's): random 4 KiB reads at queue depth 1 (psync) and 32 (libaio), sequential
512 KiB reads at queue depth 8 (libaio), on a loop device that reads a file on the root disk
with O_DIRECT (each request waits for the disk under it); and random 4 KiB reads at queue
depth 1 on a loop device over tmpfs, whose requests take a few microseconds: there fio's
latency is almost all fio's own path (submission, completion, reaping), which it adds to
every job. Per job and round it prints:
- the requests iotune timed, biolatency (libbpf-tools, -D) timed, and fio completed;
- how far the two histograms are apart in biolatency's log2 µs buckets (the sum of the
  per-bucket differences over the requests; iotune's slots astride a bucket edge account
  for most of it);
- p50 and p99 from iotune, beside fio's total latency (`lat`, submission to reaping) and
  completion latency (`clat`);
- the requests in flight at the drive: iotune's time-weighted mean over fio's runtime, the
  kernel's (time_in_queue: each request from its start, before issue), /sys/block/DEV/
  inflight sampled every 5 ms while fio's requests were there, and fio's queue depth.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.loopdev import loop_device
from iotune.trace import latency as lt
from tests.tools.biolatency import BIOLATENCY, buckets, ours

IOTUNE = str(Path(sys.executable).parent / "iotune")
JOBS = (
    ("randread", "4k", 1, "psync"),
    ("randread", "4k", 32, "libaio"),
    ("read", "512k", 8, "libaio"),
)


def job(
    dev: str, rw: str, bs: str, qd: int, engine: str, seconds: int, tmp: Path
) -> dict[str, Any]:
    disk = Path(dev).name
    bl = subprocess.Popen(
        ["stdbuf", "-oL", BIOLATENCY, "-D", "-d", disk],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert bl.stdout is not None
    bl.stdout.readline()  # attached
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            r, w = Path(f"/sys/block/{disk}/inflight").read_text().split()
            samples.append(int(r) + int(w))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    fio_out = tmp / "fio.json"
    argv = [
        "fio", "--name=job", f"--filename={dev}", f"--rw={rw}", f"--bs={bs}", "--direct=1",
        f"--ioengine={engine}", f"--iodepth={qd}", f"--runtime={seconds}", "--time_based",
        "--lat_percentiles=1", "--clat_percentiles=1", "--output-format=json",
        f"--output={fio_out}",
    ]  # fmt: skip
    sampler.start()
    p = subprocess.run(
        [IOTUNE, "--json", "trace", "--devices", disk, "--out", str(tmp / "t"), "--", *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    stop.set()
    sampler.join()
    bl.send_signal(signal.SIGINT)
    text, _ = bl.communicate(timeout=60)
    entry = next(d for d in json.loads(p.stdout)["devices"] if d["name"] == disk)
    fio = json.loads(fio_out.read_text())["jobs"][0]["read"]
    lat = entry["latency"]
    slots: dict[int, int] = {}
    for cls in lt.CLASSES:
        for k, v in ((lat["read"][cls] or {}).get("histogram") or {}).items():
            slots[int(k)] = slots.get(int(k), 0) + v
    (mine, _), theirs = ours(slots), buckets(text, disk)
    n = sum(theirs.values())
    l1 = sum(abs(mine.get(b, 0) - theirs.get(b, 0)) for b in set(mine) | set(theirs))
    busy = [i for i, s in enumerate(samples) if s]
    window = samples[busy[0] : busy[-1] + 1] if busy else [0]
    runtime_s = fio["runtime"] / 1000
    pct = {k: fio[k]["percentile"] for k in ("lat_ns", "clat_ns")}
    return {
        "timed": lat["read"]["requests"],
        "biolatency": n,
        "fio_ios": fio["total_ios"],
        "l1": l1 / max(n, 1),
        "p50": lat["read"]["p50_us"],
        "p99": lat["read"]["p99_us"],
        "lat50": pct["lat_ns"]["50.000000"] / 1000,
        "lat99": pct["lat_ns"]["99.000000"] / 1000,
        "clat50": pct["clat_ns"]["50.000000"] / 1000,
        "clat99": pct["clat_ns"]["99.000000"] / 1000,
        "mean": sum(lat["depth"]["busy_ns"].values()) / 1e9 / runtime_s,
        "kernel_over_ours": lat["depth"]["kernel_mean"] / lat["depth"]["mean"]
        if lat["depth"]["mean"]
        else None,
        "sampled": statistics.fmean(window),
        "qd": qd,
        "exact": entry["check"]["exact"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows: list[tuple[str, dict[str, Any]]] = []
    shm, disk = "/dev/shm", "/var/tmp"  # noqa: S108 - RAM and a disk, on purpose
    with (
        tempfile.TemporaryDirectory() as tmp,
        loop_device(shm, mib=256) as fast,
        loop_device(disk, mib=1024, direct_io=True) as slow,
    ):
        for r in range(args.rounds):
            name = f"tmpfs randread 4k qd1 psync #{r + 1}"
            rows.append((name, job(fast, "randread", "4k", 1, "psync", args.seconds, Path(tmp))))
            for rw, bs, qd, engine in JOBS:
                name = f"disk {rw} {bs} qd{qd} {engine} #{r + 1}"
                rows.append((name, job(slow, rw, bs, qd, engine, args.seconds, Path(tmp))))
                print(name, rows[-1][1], file=sys.stderr)
    head = (
        f"{'job':<38} {'timed':>7} {'biolat':>7} {'fio':>7} {'L1':>6} {'p50':>8} {'lat50':>8} "
        f"{'clat50':>8} {'p99':>8} {'lat99':>8} {'clat99':>8} {'inflt':>6} {'k/ours':>6} "
        f"{'/sys':>6} {'QD':>3}"
    )
    print(head)
    for name, d in rows:
        print(
            f"{name:<38} {d['timed']:>7} {d['biolatency']:>7} {d['fio_ios']:>7} {d['l1']:>6.2%} "
            f"{d['p50']:>8.1f} {d['lat50']:>8.1f} {d['clat50']:>8.1f} {d['p99']:>8.1f} "
            f"{d['lat99']:>8.1f} {d['clat99']:>8.1f} {d['mean']:>6.2f} "
            f"{d['kernel_over_ours'] or 0:>6.3f} {d['sampled']:>6.2f} {d['qd']:>3}"
        )
    print("latencies in µs; inflt: iotune's time-weighted in-flight mean over fio's runtime;")
    print("k/ours: the kernel's time_in_queue mean over iotune's; /sys: inflight sampled")


if __name__ == "__main__":
    main()
