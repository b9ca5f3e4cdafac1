"""Sweep space and strategy logic, fio JSON parsing (recorded), config merging."""

import json
from pathlib import Path
from typing import Any

import pytest

from iotune.errors import UsageError
from iotune.sweep import space as sp
from iotune.sweep.config import merge_aio
from iotune.sweep.fio import parse_fio_json
from iotune.sweep.runner import SweepSpec
from iotune.sweep.threads import parse_params

DATA = Path(__file__).resolve().parent.parent / "data"
K, M = 1024, 1024 * 1024


def synthetic(p: sp.Point) -> float:
    """A made-up bandwidth surface with one peak: 1M blocks, qd 32, 4 threads, overlap on."""
    score = 10.0
    score -= abs(p.block_size.bit_length() - (M).bit_length())
    score -= abs(p.queue_depth.bit_length() - (32).bit_length()) * 0.5
    score -= abs(p.threads.bit_length() - (4).bit_length()) * 0.7
    score -= 0.3 if p.single_submit else 0.0
    score += 0.2 if p.overlap_events else 0.0
    return score * (1.1 if p.op == "read" else 1.0)


def drive(strategy: sp.Strategy, fail: set[str] = frozenset()) -> list[sp.Point]:  # type: ignore[assignment]
    measured: list[sp.Point] = []
    try:
        batch = next(strategy)
        while True:
            measured += batch
            batch = strategy.send(
                {p.key(): None if p.key() in fail else synthetic(p) for p in batch}
            )
    except StopIteration:
        pass
    return measured


def test_grid_is_the_full_product_per_op() -> None:
    space = sp.Space(
        block_size=(256 * K, M),
        queue_depth=(4, 16, 64),
        threads=(1, 2),
        single_submit=(False,),
        overlap_events=(True, False),
        ops=("read", "write"),
    )
    pts = drive(sp.grid(space, repeats=3))
    assert len(pts) == space.size() == 2 * 3 * 2 * 1 * 2 * 2
    assert len({p.key() for p in pts}) == len(pts)


def test_adaptive_finds_the_peak_with_far_fewer_points() -> None:
    space = sp.Space()  # the default, wider than DeepSpeed's own grid
    pts = drive(sp.adaptive(space, repeats=3))
    assert space.size() == 7 * 6 * 4 * 2 * 2 * 2
    assert len(pts) < space.size() / 10
    for op in ("read", "write"):
        sweep = [p for p in pts if p.op == op and p.phase == "sweep"]
        best = max(sweep, key=synthetic)
        assert best.config() == (M, 32, 4, False, True)
        finals = [p for p in pts if p.op == op and p.phase == "final"]
        assert len(finals) == 3 and all(p.repeats == 6 for p in finals)
        assert best.config() in [p.config() for p in finals]


def test_adaptive_survives_failed_points() -> None:
    space = sp.Space(
        block_size=(256 * K, M, 4 * M),
        queue_depth=(8, 32),
        threads=(1, 4),
        single_submit=(False,),
        overlap_events=(True,),
        ops=("read",),
    )
    fail = {sp.Point("read", 4 * M, 8, 1, False, True, repeats=2).key()}
    pts = drive(sp.adaptive(space, repeats=2), fail=fail)
    assert fail <= {p.key() for p in pts}


def rec(
    op: str,
    cfg: tuple[int, int, int, bool, bool],
    bw: float,
    phase: str = "sweep",
    status: str = "ok",
) -> dict[str, Any]:
    bs, qd, t, ss, oe = cfg
    return {
        "op": op,
        "block_size": bs,
        "queue_depth": qd,
        "threads": t,
        "single_submit": ss,
        "overlap_events": oe,
        "bw_bytes_s": bw,
        "phase": phase,
        "status": status,
    }


A = (M, 32, 4, False, True)
B = (512 * K, 16, 2, False, True)


def test_best_prefers_finalist_remeasurement_and_skips_failures() -> None:
    records = [
        rec("read", A, 5.0),
        rec("read", B, 4.0),
        rec("read", A, 4.5, phase="final"),
        rec("read", B, 4.6, phase="final"),
        rec("read", (8 * M, 128, 8, True, True), 0, status="failed"),
    ]
    assert sp.config_of(sp.best_per_op(records)["read"]) == B


def test_balanced_is_the_geometric_mean_choice() -> None:
    records = [
        rec("read", A, 10.0),
        rec("write", A, 5.0),
        rec("read", B, 8.0),
        rec("write", B, 8.0),
    ]
    cfg, score = sp.balanced(records)  # type: ignore[misc]
    assert cfg == B
    assert score == pytest.approx(((8 / 10) * (8 / 8)) ** 0.5)
    assert sp.balanced([rec("read", A, 1.0)]) is None


def test_aio_block_has_the_keys_deepspeed_reads_and_real_booleans() -> None:
    block = sp.aio_block(A)
    assert block == {
        "block_size": M,
        "queue_depth": 32,
        "intra_op_parallelism": 4,
        "single_submit": False,
        "overlap_events": True,
        "use_gds": False,
    }
    text = json.dumps(block)
    assert (
        '"single_submit": false' in text
        and "num_threads" not in text
        and "thread_count" not in text
    )


def test_merge_keeps_everything_else() -> None:
    cfg = {"train_batch_size": 8, "aio": {"num_threads": 4}, "zero_optimization": {"stage": 3}}
    merged = merge_aio(cfg, sp.aio_block(A))
    assert merged["train_batch_size"] == 8 and merged["zero_optimization"] == {"stage": 3}
    assert merged["aio"] == sp.aio_block(A)
    assert cfg["aio"] == {"num_threads": 4}  # the input is not modified


def test_fio_json_recorded_output() -> None:
    text = (DATA / "fio/read-512k-qd8.json").read_text()
    res = parse_fio_json(text, "read")
    assert res["bw_bytes_s"] == 2396745142.0
    assert res["iops"] == pytest.approx(4571.43, rel=1e-4)
    assert res["fio_version"] == "fio-3.33"
    assert res["clat_mean_us"] > 0


def test_spec_round_trips_through_json() -> None:
    spec = SweepSpec(
        target="/mnt/x",
        space=sp.Space(block_size=(M,), ops=("read",)),
        io_size=M * 64,
        repeats=3,
        strategy="adaptive",
        fio=True,
        gpu=False,
        gds=False,
        budget_s=None,
        point_timeout_s=60.0,
    )
    assert SweepSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


@pytest.mark.parametrize(
    ("text", "n"),
    [("2B", 2 * 10**9), ("500M", 5 * 10**8), ("1e8", 10**8), ("1.5B", 15 * 10**8), ("1000", 1000)],
)
def test_parse_params(text: str, n: int) -> None:
    assert parse_params(text) == n


def test_parse_params_rejects() -> None:
    with pytest.raises(UsageError):
        parse_params("lots")
