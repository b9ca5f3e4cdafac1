"""`iotune sweep-aio` and `sweep-threads` with the real DeepSpeed async_io and cpu_adam ops,
real fio, on a loop device with a real filesystem."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.root.conftest import IOTUNE, iotune, sh

pytestmark = pytest.mark.beside_study

K, M = 1024, 1024 * 1024
SMALL = [
    "--block-size",
    "256K,1M",
    "--queue-depth",
    "4,16",
    "--threads",
    "1",
    "--single-submit",
    "false",
    "--overlap-events",
    "true",
    "--io-size",
    "16M",
    "--repeats",
    "2",
    "--strategy",
    "grid",
]


@pytest.fixture
def volume(loop_device: Callable[..., str]) -> Path:
    loop_device(size_mib=512, fs="ext4", mount=True)
    return Path(loop_device.mounts[0])  # type: ignore[attr-defined]


def sweep(
    *args: str, check: bool = True
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    p = iotune("--json", "sweep-aio", *args, check=check)
    return p, (json.loads(p.stdout) if p.stdout.strip() else {})


def points(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "points.jsonl").read_text().splitlines()]


def leftovers(target: Path) -> list[str]:
    return sorted(
        f.name for f in target.iterdir() if f.name.startswith(("iotune-aio-", "iotune-fio-"))
    )


def test_small_grid_sweep_and_a_config_deepspeed_reads(volume: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(
        json.dumps(
            {
                "train_batch_size": 8,
                "zero_optimization": {"stage": 3},
                "aio": {"num_threads": 8, "single_submit": "false"},
            }
        )
    )
    run = tmp_path / "run"
    _, doc = sweep("--target", str(volume), *SMALL, "--out", str(run), "--write-config", str(cfg))
    recs = points(run)
    assert len(recs) == doc["points"] == 8 and doc["ok"] == 8
    assert len({r["key"] for r in recs}) == 8
    for r in recs:
        assert r["status"] == "ok" and r["bw_bytes_s"] > 0 and len(r["seconds"]) == 2
        assert r["pct_of_fio"] > 0 and r["fio_bw_bytes_s"] > 0
        if r["op"] == "read":
            assert r["page_cache_dropped"] is True and r["resident_after_drop"] == 0
    # one worker measured them all, with the one pinned buffer DeepSpeed used directly
    assert len({r["worker_pid"] for r in recs}) == 1
    assert {r["buffer"] for r in recs} == {"kept"}
    ceilings = [json.loads(x) for x in (run / "fio.jsonl").read_text().splitlines()]
    assert {(c["op"], c["block_size"], c["queue_depth"]) for c in ceilings} == {
        (op, bs, qd) for op in ("read", "write") for bs in (256 * K, M) for qd in (4, 16)
    }
    written = json.loads(cfg.read_text())
    assert written["train_batch_size"] == 8 and written["zero_optimization"] == {"stage": 3}
    assert written["aio"] == doc["aio"] == doc["balanced"]["config"]
    assert set(written["aio"]) == {
        "block_size",
        "queue_depth",
        "intra_op_parallelism",
        "single_submit",
        "overlap_events",
        "use_gds",
    }
    # DeepSpeed's own reader sees exactly these values
    code = (
        "import json, sys\nfrom deepspeed.runtime.swap_tensor.aio_config import get_aio_config\n"
        "print(json.dumps(get_aio_config(json.load(open(sys.argv[1])))))"
    )
    seen = subprocess.run(
        [sys.executable, "-c", code, str(cfg)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    assert json.loads(seen.stdout.strip().splitlines()[-1]) == written["aio"]
    assert leftovers(volume) == []


def test_kill_then_resume_loses_nothing_and_repeats_nothing(
    volume: Path, tmp_path: Path, plain_workers: None
) -> None:
    """Plain workers: the group's kill -9 must reach the worker itself, which then cleans up
    nothing (a zygote's worker is outside the group and would remove its file on SIGTERM)."""
    run = tmp_path / "run"
    args = [
        "--target",
        str(volume),
        "--block-size",
        "128K,256K,512K,1M",
        "--queue-depth",
        "4,8",
        "--threads",
        "1",
        "--single-submit",
        "false",
        "--overlap-events",
        "true",
        "--ops",
        "write",
        "--io-size",
        "8M",
        "--repeats",
        "1",
        "--strategy",
        "grid",
        "--no-fio",
        "--out",
        str(run),
    ]
    child = subprocess.Popen(
        [IOTUNE, "sweep-aio", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    while not (
        (run / "points.jsonl").exists()
        and len((run / "points.jsonl").read_text().splitlines()) >= 2
    ):
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)  # the sweep and its worker, no chance to clean up
    child.wait()
    before = points(run)
    assert 2 <= len(before) < 8
    _, doc = sweep("--resume", str(run))
    after = points(run)
    assert len(after) == 8 and len({r["key"] for r in after}) == 8
    assert after[: len(before)] == before  # finished points kept as they were
    assert doc["points"] == 8
    assert leftovers(volume) == []  # the killed worker's data file is gone too


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(volume: Path, tmp_path: Path) -> None:
    # io_setup() of a 1024-deep queue fails once the host allows fewer AIO events
    limit = Path("/proc/sys/fs/aio-max-nr")
    old = limit.read_text()
    limit.write_text("512\n")
    try:
        run = tmp_path / "run"
        _, doc = sweep(
            "--target",
            str(volume),
            "--block-size",
            "256K",
            "--queue-depth",
            "4,1024,8",
            "--threads",
            "1",
            "--single-submit",
            "false",
            "--overlap-events",
            "true",
            "--ops",
            "write",
            "--io-size",
            "8M",
            "--repeats",
            "1",
            "--strategy",
            "grid",
            "--no-fio",
            "--out",
            str(run),
        )
    finally:
        limit.write_text(old)
    recs = points(run)
    assert [r["queue_depth"] for r in recs] == [4, 1024, 8]  # measured in this order
    by_qd = {r["queue_depth"]: r for r in recs}
    assert by_qd[4]["status"] == "ok"
    assert by_qd[1024]["status"] == "failed" and by_qd[1024]["error"]
    assert by_qd[8]["status"] == "ok"
    assert by_qd[8]["worker_pid"] != by_qd[4]["worker_pid"]  # a fresh worker after the failure
    assert doc["ok"] == 2 and doc["failed"] == 1
    assert doc["aio"]["queue_depth"] in (4, 8)


def test_bad_input_is_refused_before_anything_runs(volume: Path, tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    sh("mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(shm))
    try:
        cases = [
            (["--target", str(volume), "--block-size", "6K"], "6144 is not a multiple of 4K"),
            (["--target", str(shm)], "is on tmpfs: RAM, not a drive"),
            (
                ["--target", str(volume), "--io-size", "10M", "--threads", "3"],
                "does not divide by 3 threads",
            ),
            (["--target", str(tmp_path / "nope")], "does not exist"),
            (["--target", str(volume), "--queue-depth", "0"], "is not a positive whole number"),
            (["--target", str(volume), "--ops", "read,append"], "append is not read or write"),
        ]
        for args, message in cases:
            size = [] if "--io-size" in args else ["--io-size", "16M"]
            p = iotune("sweep-aio", *args, *size, "--out", str(tmp_path / "never"), check=False)
            assert p.returncode == 2, (args, p.stderr)
            assert message in p.stderr.splitlines()[0], p.stderr
            assert not (tmp_path / "never").exists()
        sh("mount", "-o", "remount,ro", str(volume))
        p = iotune("sweep-aio", "--target", str(volume), "--io-size", "16M", check=False)
        assert p.returncode == 2 and "is not writable" in p.stderr
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(volume)], check=False)
        subprocess.run(["umount", str(shm)], check=False)


def test_adaptive_sweep_on_a_real_target(volume: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    _, doc = sweep(
        "--target",
        str(volume),
        "--block-size",
        "256K,1M",
        "--queue-depth",
        "4,16",
        "--threads",
        "1,2",
        "--single-submit",
        "false",
        "--overlap-events",
        "true",
        "--io-size",
        "8M",
        "--repeats",
        "1",
        "--strategy",
        "adaptive",
        "--no-fio",
        "--out",
        str(run),
    )
    recs = points(run)
    assert {r["phase"] for r in recs} <= {"sweep", "final", "cross"}
    assert all(r["status"] == "ok" for r in recs), [r for r in recs if r["status"] != "ok"]
    cfg = ("block_size", "queue_depth", "threads", "single_submit", "overlap_events")
    best = {op: tuple(doc["best"][op][k] for k in cfg) for op in ("read", "write")}
    survivors: set[tuple[Any, ...]] = set()
    measured = {op: {tuple(r[k] for k in cfg) for r in recs if r["op"] == op} for op in best}
    for op, other in (("read", "write"), ("write", "read")):
        mine = [r for r in recs if r["op"] == op]
        assert len([r for r in mine if r["phase"] == "sweep"]) <= 2 * 2 * 2
        # the race: rounds 1, 2, 3; the best is one of the last round's
        last = {tuple(r[k] for k in cfg) for r in mine if r.get("round") == 3}
        assert {r.get("round") for r in mine if r["phase"] == "final"} == {1, 2, 3}
        assert doc["best"][op]["phase"] == "final" and best[op] in last
        survivors |= last
        # each op's best is measured on the other op too
        assert best[op] in measured[other]
    # the balanced choice: a survivor of either op's race, measured for both ops
    aio = doc["balanced"]["config"]
    chosen = tuple(
        aio[k]
        for k in (
            "block_size",
            "queue_depth",
            "intra_op_parallelism",
            "single_submit",
            "overlap_events",
        )
    )
    assert chosen in survivors and chosen in measured["read"] & measured["write"]
    assert 0 < doc["balanced"]["score"] <= 1
    assert doc["aio"] == aio


def test_sweep_threads_times_the_real_cpu_adam_alone_and_ranks_side_by_side(
    tmp_path: Path,
) -> None:
    """The real DeepSpeedCPUAdam at 1 and 2 threads, one rank alone and two ranks at once
    (each on half the parameters, every step started together), and the host's memory
    bandwidth; each figure counted again from what the record holds, and the record read
    back by `estimate --ranks 2 --threads-config` as its CPU Adam and its host memory."""
    out = tmp_path / "threads"
    doc = json.loads(
        iotune(
            *("--json", "sweep-threads", "--params", "20M", "--threads", "1,2"),
            *("--ranks", "1,2", "--repeats", "3", "--out", str(out)),
        ).stdout
    )
    # the record 'iotune estimate --threads-config' and 'iotune report' read
    assert json.loads((out / "threads.json").read_text()) == doc
    assert [(r["ranks"], r["threads"]) for r in doc["rows"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for r in doc["rows"]:
        assert r["status"] == "ok" and r["params"] == 20_000_000 // r["ranks"]
        assert len(r["step_ms"]) == 3 and r["step_ms_median"] > 0
        assert r["step_ms_median"] == statistics.median(r["step_ms"])
        assert (r["step_ms_min"], r["step_ms_max"]) == (min(r["step_ms"]), max(r["step_ms"]))
        if r["ranks"] == 2:
            # each step is its slowest rank's: its median is at least each rank's own
            assert len(r["rank_step_ms_median"]) == 2
            assert r["step_ms_median"] >= max(r["rank_step_ms_median"])
    by = doc["best_threads_by_ranks"]
    assert set(by) == {"1", "2"} and doc["best_threads"] == by["1"]
    mem = doc["memory"]
    assert [m["threads"] for m in mem["rows"]] == [1, 2]
    for m in mem["rows"]:
        # STREAM's count: copy 8 bytes an element, triad 12
        assert (m["copy_bytes"], m["triad_bytes"]) == (8 * mem["elements"], 12 * mem["elements"])
        assert m["triad_bytes_s"] == m["triad_bytes"] / m["triad_s"] > 0
        assert m["copy_bytes_s"] == m["copy_bytes"] / m["copy_s"] > 0
    best = max(mem["rows"], key=lambda m: m["triad_bytes_s"])
    assert mem["best"] == {"threads": best["threads"], "triad_bytes_s": best["triad_bytes_s"]}
    est = json.loads(
        iotune(
            *("--json", "estimate", "tiny_opt_nvme", "--ranks", "2", "--set", "cpu_threads=2"),
            *("--threads-config", str(out), "--drive", "read=1GB/s,write=1GB/s", "--drives", "1"),
        ).stdout
    )
    limits = {x["what"]: x for x in est["drives"]["limits"]}
    assert limits["host memory (measured)"]["value"] == best["triad_bytes_s"]
    two = next(r for r in doc["rows"] if (r["ranks"], r["threads"]) == (2, 2))
    (adam,) = [t for t in est["drives"]["plans"][0]["terms"] if t["kind"] == "adam"]
    share = est["params"] // 2
    assert adam["seconds"] == round(two["step_ms_median"] / 1000 / two["params"] * share, 3)
    assert "timed with 2 ranks at once" in adam["what"]
    p = iotune("sweep-threads", "--params", "900B", check=False)
    assert p.returncode == 2 and "GiB of RAM" in p.stderr


def test_page_cache_residency_matches_fincore(tmp_path: Path) -> None:
    from iotune.workers.aio_point import drop_file_cache, resident_bytes

    f = tmp_path / "cached.dat"
    f.write_bytes(os.urandom(4 * M))
    f.read_bytes()

    def fincore() -> int:
        out = sh("fincore", "--bytes", "--noheadings", "--output", "RES", str(f))
        return int(out.strip())

    assert resident_bytes(str(f)) == fincore() == 4 * M
    assert drop_file_cache(str(f)) == fincore() == 0


def test_shipped_deepspeed_template_passes_deepspeeds_own_readers() -> None:
    from iotune.sweep.config import validate

    top = Path(__file__).resolve().parents[2]
    cfg = json.loads((top / "configs/ds_zero3_offload_nvme.json").read_text())
    report = validate(cfg)
    assert report["errors"] == []
    assert report["zero_stage"] == 3
    assert report["aio_used"] == cfg["aio"]


def test_swap_rehearsal_moves_the_models_bytes_and_is_kept_on_resume(
    loop_device: Callable[..., str], tmp_path: Path
) -> None:
    """--swap-pattern times the preset's optimizer swapping with the real async_io op: the
    bytes are the I/O model's per-step optimizer reads and writes (DeepSpeed's 1 KiB
    alignment aside), the files are gone after, and a resumed sweep keeps the record."""
    from iotune.model.dsconfig import ds_config
    from iotune.model.presets import get_preset
    from iotune.model.swapfiles import swap_layout, swapped_counts

    loop_device(size_mib=1024, fs="ext4", mount=True)
    volume = Path(loop_device.mounts[0])  # type: ignore[attr-defined]
    run = tmp_path / "run"
    args = ["--block-size", "1M", "--queue-depth", "8", *SMALL[4:], "--no-fio"]
    args += ["--swap-pattern", "tiny_opt_nvme"]
    _, doc = sweep("--target", str(volume), *args, "--out", str(run))
    swap = doc["swap"]
    assert swap["status"] == "ok" and swap["preset"] == "tiny_opt_nvme"
    assert swap["block_size"] == doc["aio"]["block_size"]
    p = get_preset("tiny_opt_nvme")
    cfg = ds_config(p, aio=doc["aio"])
    sw = swapped_counts(p, cfg)
    layout = swap_layout(p, cfg)
    slack = 1024 * sum(3 + len(gs) for _, gs in layout)
    assert 0 <= swap["read_bytes"] - (12 * sw.n_s + 4 * sw.n_g) <= slack
    assert 0 <= swap["write_bytes"] - 12 * sw.n_s <= slack
    assert swap["files"] == sum(3 + len(gs) for _, gs in layout)
    assert len(swap["rounds"]) == 2
    assert all(r["read_s"] > 0 and r["write_s"] > 0 for r in swap["rounds"])
    assert swap["read_bw_bytes_s"] > 0 and swap["write_bw_bytes_s"] > 0
    assert not [f for f in volume.iterdir() if f.name.startswith("iotune-swap-")]
    lines = (run / "swap.jsonl").read_text().splitlines()
    assert len(lines) == 1
    # resumed: the points and the rehearsal are kept, none is measured again
    _, again = sweep("--resume", str(run))
    assert again["swap"] == json.loads(lines[0])
    assert (run / "swap.jsonl").read_text().splitlines() == lines
    # a preset that swaps nothing is refused before anything runs
    p2 = iotune(
        "sweep-aio",
        "--target",
        str(volume),
        *args[:-1],
        "opt_ram_1b",
        "--out",
        str(tmp_path / "never"),
        check=False,
    )
    assert p2.returncode == 2 and "is not swapped to NVMe" in p2.stderr.splitlines()[0]
    assert not (tmp_path / "never").exists()
