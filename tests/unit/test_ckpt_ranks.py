"""Unit: a save of a run of several ranks, counted once. Each rank's worker times its own
``save_checkpoint`` and then walks the tag folder; DeepSpeed's save ends in a barrier, so by
then the folder holds every rank's files. The merged save is the folder's size (counted here
by find(1)), and the parity of a RAID5/6 checkpoint volume is measured against it."""

from __future__ import annotations

import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from iotune.model.dsconfig import ds_config
from iotune.model.estimate import estimate
from iotune.model.presets import get_preset
from iotune.trace.targets import Array
from iotune.train.checkpoint import save_rows
from iotune.train.ranks import merge_ranks
from iotune.workers.checkpoints import save_checkpoint

KIB, MIB = 1 << 10, 1 << 20
RANKS = 2


class _Engine:
    """DeepSpeed's ZeRO-3 save as its files and its closing barrier: each rank writes its
    model and optimizer pickles and copies its swap folder (runtime/engine.py, 0.19.8), then
    waits for the others (``dist.barrier()``)."""

    def __init__(self, rank: int, barrier: threading.Barrier, sizes: dict[str, int]) -> None:
        self.rank, self.barrier, self.sizes = rank, barrier, sizes
        self.global_rank = rank

    def save_checkpoint(
        self, save_dir: str, tag: str, client_state: dict[str, Any], save_latest: bool = True
    ) -> None:
        assert not save_latest  # iotune writes latest itself, once the save is durable
        top = Path(save_dir) / tag
        swp = top / "offloaded_tensors" / f"rank{self.rank:02d}" / "zero_stage_3" / "optimizer"
        swp.mkdir(parents=True, exist_ok=True)
        for name, size in self.sizes.items():
            f = (
                swp / name
                if name.endswith(".swp")
                else top / f"zero_pp_rank_{self.rank}_mp_rank_00_{name}"
            )
            f.write_bytes(b"\1" * size)
        self.barrier.wait(timeout=30)


class _Acc:
    def synchronize(self) -> None:
        pass


class _Events:
    def __init__(self, rank: int, sink: list[dict[str, Any]], lock: threading.Lock) -> None:
        self.rank, self.sink, self.lock = rank, sink, lock

    def emit(self, rec: dict[str, Any]) -> None:
        with self.lock:
            self.sink.append({**rec, "rank": self.rank, "node": "n0"})


#: each rank's files: the copy of its swap files (12 bytes a swapped parameter) and the two
#: pickles; rank 1's partition is a little smaller, as ZeRO's ceil split leaves it
SIZES = [
    {
        "model_states.pt": 70 * KIB,
        "optim_states.pt": 9 * KIB,
        "fp32.tensor.swp": 4 * MIB,
        "exp_avg.tensor.swp": 4 * MIB,
        "exp_avg_sq.tensor.swp": 4 * MIB,
    },
    {
        "model_states.pt": 70 * KIB,
        "optim_states.pt": 9 * KIB,
        "fp32.tensor.swp": 4 * MIB - 4 * KIB,
        "exp_avg.tensor.swp": 4 * MIB - 4 * KIB,
        "exp_avg_sq.tensor.swp": 4 * MIB - 4 * KIB,
    },
]


def _two_rank_save(folder: Path) -> list[dict[str, Any]]:
    """The events both ranks' workers emit for one save after step 1 (the real worker's
    save_checkpoint, one thread a rank)."""
    barrier, lock = threading.Barrier(RANKS), threading.Lock()
    events: list[dict[str, Any]] = []
    ck = {"dir": str(folder), "tag": "step{}", "writer": "torch"}

    def rank(r: int) -> None:
        save_checkpoint(_Engine(r, barrier, SIZES[r]), ck, 1, 1, _Events(r, events, lock), _Acc())

    with ThreadPoolExecutor(RANKS) as pool:
        for done in [pool.submit(rank, r) for r in range(RANKS)]:
            done.result()  # a rank's failure is the test's
    return events


def _find(folder: Path, *pattern: str) -> tuple[int, int]:
    """(files, bytes) under *folder* as find(1) counts them."""
    out = subprocess.run(
        ["find", str(folder), "-type", "f", *pattern, "-printf", "%s\\n"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return len(out), sum(int(x) for x in out)


def test_a_two_rank_save_is_the_tag_folders_size_not_twice_it(tmp_path: Path) -> None:
    events = _two_rank_save(tmp_path / "ck")
    assert sorted(e["rank"] for e in events) == [0, 1]
    files, size = _find(tmp_path / "ck" / "step1")
    swap_files, swap_size = _find(tmp_path / "ck" / "step1", "-name", "*.swp")
    # the hand count: both ranks' files, each once
    assert size == sum(sum(s.values()) for s in SIZES) and files == 10
    (save,) = [e for e in merge_ranks(events) if e["event"] == "checkpoint"]
    assert (save["files"], save["bytes"], save["swap_copy_bytes"]) == (files, size, swap_size)
    assert swap_files == 6
    # the seconds stay the slower rank's
    assert save["durable_s"] == max(e["durable_s"] for e in events)
    # latest written once, by rank 0, after the folder: the only other entry beside it
    assert (tmp_path / "ck" / "latest").read_text() == "step1"
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["latest", "step1"]


def test_parity_of_a_two_rank_save_is_measured_against_the_folder(tmp_path: Path) -> None:
    events = _two_rank_save(tmp_path / "ck")
    _, size = _find(tmp_path / "ck" / "step1")
    # a RAID5 of 4 (3 data members) wrote the save in full stripes: 4/3 of it
    members = ("d0", "d1", "d2", "d3")
    each = size * 4 // 3 // 4
    io = [
        {
            "label": "checkpoint:1",
            "read": {"bytes": 0},
            "write": {"bytes": 4 * each},
            "drives": {m: {"read": 0, "write": each} for m in members},
        }
    ]
    p = get_preset("tiny_opt_nvme")
    est = estimate(p, ds_config(p))
    doc = save_rows(
        merge_ranks(events),
        io,
        est,
        True,
        (),
        members,
        Array("md0", "raid5", 512 * KIB, members),
    )
    assert doc is not None
    (row,) = doc["saves"]
    parity = row["parity"]
    assert parity["saved_bytes"] == size
    assert parity["amplification"] == pytest.approx(4 / 3, abs=1e-4)
    assert parity["amplification"] == parity["ideal"]
