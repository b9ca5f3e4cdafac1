"""`iotune sweep-checkpoint` with DeepSpeed's real FastFileWriter and aio op, on a loop
device with ext4: every save a checkpoint that loads back, its bytes those of torch.save,
the best merged into a config DeepSpeed reads, and an interrupted search resumed."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from iotune.sweep import ckpt
from tests.root.conftest import IOTUNE, iotune

pytestmark = pytest.mark.beside_study

N = 3_000_000  # parameters: a 36 MB state in two sub-groups
GRID = [
    "--params",
    str(N),
    "--sub-group-size",
    "2000000",
    "--io-buffer-size",
    "1M",
    "--io-buffer-double",
    "true,false",
    "--block-size",
    "256K",
    "--queue-depth",
    "8",
    "--threads",
    "1",
]  # six saves in the first round: the defaults, then CRC32 off, the records in place, a
# 1 MiB buffer, a single one, 256 KiB blocks


@pytest.fixture
def volume(loop_device: Callable[..., str]) -> Path:
    loop_device(size_mib=256, fs="ext4", mount=True)
    return Path(loop_device.mounts[0])  # type: ignore[attr-defined]


def test_each_save_is_a_real_checkpoint_and_the_best_goes_into_the_config(
    volume: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1}))
    run = tmp_path / "run"
    res = json.loads(
        iotune(
            "--json", "sweep-checkpoint", "--target", str(volume), *GRID, "--rounds", "1",
            "--out", str(run), "--write-config", str(cfg),
        ).stdout
    )  # fmt: skip
    pts = res["points"]
    assert pts[0]["stage"] == "default"
    space = ckpt.Space.from_json(json.loads((run / "spec.json").read_text())["space"])
    # one round (the rounds' logic is the unit tier's): each knob's values once
    assert len({p["key"] for p in pts}) == len(pts) == space.size()
    assert space.rounds == 1 and {p["round"] for p in pts} == {0, 1}
    # the records read in place save the same bytes, and load back equal (below)
    # (no copy in place, by the bytes the writer's record copy took; DeepSpeed's own copies
    # every record: the state's 12 bytes a parameter and the zip's small ones)
    (in_place,) = [p for p in pts if (p["stage"], p["round"]) == ("record_copy", 1)]
    assert in_place["record_copy"] is False and in_place["copy_bytes"] == 0, in_place
    assert 12 * N <= pts[0]["copy_bytes"] <= pts[0]["bytes"], pts[0]
    # every save loaded back equal to the state: 12 bytes a parameter and the zip records
    # around them
    torch_rec = res["torch"]
    assert torch_rec["status"] == "ok" and torch_rec["verified"] is True
    assert 12 * N < torch_rec["bytes"] < 12 * N + 64 * 1024
    for p in pts:
        assert p["status"] == "ok", p
        assert p["verified"] is True
        # the same bytes at every point; beside torch.save's, only the zip's folder name
        # differs (the file's stem there, "archive" in a stream), in each record's two headers
        assert p["bytes"] == pts[0]["bytes"]
        assert 12 * N < p["bytes"] < 12 * N + 64 * 1024
        assert p["buffer"] == "locked by the aio op (no GPU)"
        # the writer's own statistics (DeepSpeed counts its close's last drain twice in the
        # wait, which may then exceed the save with the fill: 0.093 s of 0.092 s seen)
        assert 0 < p["fill_s"] <= p["durable_s"] and p["aio_write_s"] > 0
    best = res["best"]
    assert best["durable_s"] == min(p["durable_s"] for p in pts)
    assert res["ceiling"]["status"] == "ok" and res["ceiling"]["bw_bytes_s"] > 0
    assert res["why"][0].startswith("the default spent")
    # the config holds the best writer and DeepSpeed reads it so
    written = json.loads(cfg.read_text())
    k = ckpt.knobs_of(best)
    assert written["checkpoint"]["writer"] == k.writer_section()
    assert written["aio"] == k.aio_section()
    assert written["train_micro_batch_size_per_gpu"] == 1
    used = res["written"]["writer_used"]
    assert (used["type"], used["io_buffer_size"], used["io_buffer_double"]) == (
        "FAST",
        k.io_buffer_size,
        k.io_buffer_double,
    )
    assert not list(volume.glob("iotune-ckpt-*"))
    # a resumed search that is done saves nothing more
    lines = (run / ckpt.POINTS).read_text().count("\n")
    again = json.loads(iotune("--json", "sweep-checkpoint", "--resume", str(run)).stdout)
    assert (run / ckpt.POINTS).read_text().count("\n") == lines
    assert again["best"]["key"] == best["key"]


def test_ctrl_c_keeps_the_saves_and_resume_finishes_the_same_search(
    volume: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    child = subprocess.Popen(
        [
            IOTUNE,
            "sweep-checkpoint",
            "--target",
            str(volume),
            *GRID,
            *("--rounds", "1"),
            "--out",
            str(run),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    points = run / ckpt.POINTS
    deadline = time.monotonic() + 300
    while not (points.exists() and points.read_text().count('"writer": "fast"') >= 2):
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, err
    assert f"--resume {run}" in out.replace("\n", " ")
    kept = ckpt.load_points(run)
    assert all(r["status"] == "ok" for r in kept), kept  # the interrupted save is not a failure
    assert not list(volume.glob("iotune-ckpt-*"))
    res = json.loads(iotune("--json", "sweep-checkpoint", "--resume", str(run)).stdout)
    assert [p["key"] for p in res["points"]][: len(ckpt.fast_records(kept))] == [
        r["key"] for r in ckpt.fast_records(kept)
    ]
    assert all(p["status"] == "ok" for p in res["points"])
    assert (
        ckpt.next_point(
            ckpt.Space.from_json(json.loads((run / "spec.json").read_text())["space"]),
            ckpt.load_points(run),
        )
        is None
    )


def test_a_target_that_cannot_take_the_saves_is_refused(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    p = iotune("sweep-checkpoint", "--target", str(shm), "--params", "1M", check=False)
    assert p.returncode == 2
    assert "is on tmpfs: RAM, not a drive" in p.stderr
    p = iotune("sweep-checkpoint", "--target", str(tmp_path / "nope"), check=False)
    assert p.returncode == 2 and "does not exist" in p.stderr
    assert "Traceback" not in p.stderr
