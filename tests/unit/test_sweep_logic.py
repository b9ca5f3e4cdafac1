"""Sweep space and strategy logic, fio JSON parsing (recorded), config merging, the picks and
result.json, and the thread sweep's rules."""

import dataclasses
import json
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune.errors import UsageError
from iotune.records import load_aio
from iotune.sweep import result as sweep_result
from iotune.sweep import space as sp
from iotune.sweep import threads as sweep_threads
from iotune.sweep.config import merge_aio
from iotune.sweep.fio import parse_fio_json
from iotune.sweep.runner import SweepSpec, load_spec
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


def drive(
    strategy: sp.Strategy,
    fail: set[str] = frozenset(),  # type: ignore[assignment]
    bw: Any = synthetic,
) -> list[sp.Point]:
    """Every point *strategy* asks for, measured by bw(point) (None for keys in *fail*)."""
    measured: list[sp.Point] = []

    def measure(batch: list[sp.Point]) -> dict[str, float | None]:
        measured.extend(batch)
        return {p.key(): None if p.key() in fail else bw(p) for p in batch}

    sp.drive(strategy, measure)
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
        # the race: four finalists, then the better two in two more rounds
        assert [len([p for p in finals if p.round == r]) for r in (1, 2, 3)] == [4, 2, 2]
        assert len(finals) == sp.race_points() and all(p.repeats == 3 for p in finals)
        assert best.config() in [p.config() for p in finals if p.round == 3]
    assert len({p.key() for p in pts}) == len(pts)


def test_adaptive_stays_within_a_quarter_of_the_grid_after_its_first_pass() -> None:
    """On noisy surfaces (every point a fresh draw) the search, race included, measures at
    most a quarter of each op's 90 configurations; the first pass always completes."""
    space = sp.Space(
        block_size=(256 * K, M, 4 * M),
        queue_depth=(4, 8, 16, 32, 64),
        threads=(1, 2, 4),
        single_submit=(False,),
        overlap_events=(False, True),
        ops=("read", "write"),
    )
    per_op = space.size() // 2
    counts = []
    for seed in range(200):
        rng = random.Random(seed)  # noqa: S311 - a seeded draw, not a secret
        measured = drive(sp.adaptive(space, repeats=2), bw=lambda p, r=rng: r.uniform(3.0, 4.0))
        for op in ("read", "write"):
            n = len([p for p in measured if p.op == op])
            assert n <= per_op / 4
            counts.append(n)
    # one pass (3 + 5 + 3 + 2 values, the held point shared) and the race: 10 + 8
    assert min(counts) == 18 and max(counts) > 18


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


def race(space: sp.Space, bw: Any, fail: Any = lambda p: False) -> list[dict[str, Any]]:
    """Records of an adaptive search: bw(point) -> GiB/s; fail(point) -> a failed point."""
    records: list[dict[str, Any]] = []

    def measure(batch: list[sp.Point]) -> dict[str, float | None]:
        got = {p.key(): None if fail(p) else bw(p) for p in batch}
        records.extend(
            {
                **rec(p.op, p.config(), got[p.key()] or 0.0, phase=p.phase),
                "round": p.round,
                "status": "failed" if got[p.key()] is None else "ok",
            }
            for p in batch
        )
        return got

    sp.drive(sp.adaptive(space, repeats=2), measure)
    return records


ONE_AXIS = sp.Space(
    block_size=(256 * K, 512 * K, M, 4 * M),
    queue_depth=(8,),
    threads=(1,),
    single_submit=(False,),
    overlap_events=(True,),
    ops=("read",),
)


def test_the_race_drops_a_lucky_finalist_and_picks_among_its_survivors() -> None:
    """A configuration measured high once (in the sweep) and lower after falls out after
    the first round; the best is chosen among the survivors, measured in every round,
    although the dropped one's median of two ends above theirs of four."""
    # bandwidth by block size: the sweep's, then each round's
    bws = {
        256 * K: (7.0, 6.0, 6.0, 6.0),
        512 * K: (7.8, 7.2, 5.5, 5.5),
        M: (8.0, 7.5, 6.0, 6.0),
        4 * M: (9.0, 5.0, 5.0, 5.0),  # the lucky one: median 7.0 after round 1, third
    }
    records = race(ONE_AXIS, lambda p: bws[p.block_size][p.round])
    finals = [r["block_size"] for r in records if r["phase"] == "final"]
    assert sorted(finals) == sorted([256 * K, 512 * K, M, 4 * M, 512 * K, M, 512 * K, M])
    best = sp.best_per_op(records)["read"]
    # M: 8.0, 7.5, 6.0, 6.0 (6.75); 512K: 6.35; the dropped 4M: 9.0, 5.0 (7.0)
    assert sp.config_of(best) == (M, 8, 1, False, True)
    assert best["measurements"] == 4 and best["bw_bytes_s"] == pytest.approx(6.75)


def test_a_finalist_whose_point_fails_is_out_of_the_race() -> None:
    """1M is the fastest in every point it finishes, but its round-3 point fails: the best
    is chosen among the configurations that finished the last round; and a finalist that
    fails in round 1 takes no survivor's place."""
    speed = {256 * K: 5.0, 512 * K: 6.0, M: 9.0, 4 * M: 7.0}
    records = race(
        ONE_AXIS,
        lambda p: speed[p.block_size],
        fail=lambda p: (
            (p.block_size == M and p.round == 3) or (p.block_size == 4 * M and p.round == 1)
        ),
    )
    rounds = {r: sorted(x["block_size"] for x in records if x.get("round") == r) for r in (1, 2, 3)}
    assert rounds[1] == [256 * K, 512 * K, M, 4 * M]
    assert rounds[2] == rounds[3] == [512 * K, M]  # 4M failed: 512K took the second place
    assert sp.config_of(sp.best_per_op(records)["read"])[0] == 512 * K
    # every point of the last round fails: the round before decides
    records = race(ONE_AXIS, lambda p: speed[p.block_size], fail=lambda p: p.round == 3)
    assert sp.config_of(sp.best_per_op(records)["read"])[0] == M


def test_no_race_for_a_single_configuration() -> None:
    space = sp.Space(
        block_size=(M,),
        queue_depth=(8,),
        threads=(1,),
        single_submit=(False,),
        overlap_events=(True,),
        ops=("read",),
    )
    records = race(space, lambda p: 5.0)
    assert [r["phase"] for r in records] == ["sweep"]
    assert list(sp.adaptive(dataclasses.replace(space, ops=()), repeats=2)) == []


def test_records_from_before_the_race_choose_among_all() -> None:
    """A run recorded before rounds existed (finals without a round, twice the repeats):
    every configuration is a contender, as then."""
    records = [rec("read", A, 5.0), rec("read", B, 6.0), rec("read", A, 5.5, phase="final")]
    assert sp.config_of(sp.best_per_op(records)["read"]) == B


def test_balanced_chooses_among_the_race_survivors() -> None:
    """C, measured once per op in the sweep at a lucky high, is no candidate: the balanced
    choice is made among the ops' survivors, measured for both ops (cross)."""
    C = (4 * M, 64, 1, False, False)
    records = [
        rec("read", C, 9.0),
        rec("write", C, 9.0),
        {**rec("read", A, 7.0, phase="final"), "round": 3},
        {**rec("write", B, 6.0, phase="final"), "round": 3},
        {**rec("read", B, 6.0, phase="final"), "round": 1},
        rec("write", A, 5.0, phase="cross"),
        rec("read", B, 6.5, phase="cross"),
    ]
    cfg, score = sp.balanced(records)  # type: ignore[misc]
    assert cfg in (A, B) and 0 < score <= 1.0
    # read: A 7.0, B 6.25; write: A 5.0, B 6.0 -> B: (6.25/7 * 1) ** 0.5 > A: (5/6) ** 0.5
    assert cfg == B and score == pytest.approx((6.25 / 7.0) ** 0.5)


def test_each_ops_best_is_measured_on_the_other_op_where_the_search_did_not() -> None:
    """Sweep.cross_measure (the choice of points only; measuring is the worker's): the
    read race's winner A was never measured for writes, the write winner B was measured
    for reads: one cross point, A on writes."""
    from iotune.sweep.runner import Sweep

    records = [
        {**rec("read", A, 7.0, phase="final"), "round": 3},
        {**rec("write", B, 6.0, phase="final"), "round": 3},
        rec("read", B, 5.0),
    ]
    asked: list[sp.Point] = []
    fake = SimpleNamespace(
        records={str(i): r for i, r in enumerate(records)},
        spec=SimpleNamespace(space=sp.Space(), repeats=2),
        measure=asked.extend,
    )
    Sweep.cross_measure(fake)  # type: ignore[arg-type]
    assert [(p.op, p.config(), p.phase) for p in asked] == [("write", A, "cross")]
    asked.clear()
    fake.records["x"] = rec("write", A, 5.0, phase="cross")
    Sweep.cross_measure(fake)  # type: ignore[arg-type]
    assert asked == []


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


def test_best_is_the_median_of_every_measurement_of_a_configuration() -> None:
    records = [
        rec("read", A, 5.0),
        rec("read", B, 4.0),
        rec("read", A, 4.5, phase="final"),
        rec("read", B, 4.6, phase="final"),
        rec("read", (8 * M, 128, 8, True, True), 0, status="failed"),
    ]
    # A: 5.0 and 4.5 (4.75); B: 4.0 and 4.6 (4.3). A lower re-measurement does not hide
    # what was seen of A, and B's one better repeat does not make it the best
    best = sp.best_per_op(records)["read"]
    assert sp.config_of(best) == A
    assert best["bw_bytes_s"] == pytest.approx(4.75)
    assert best["measurements"] == 2 and best["phases"] == ["final", "sweep"]
    # every timed repeat counts, not each record's median
    many = [
        {**rec("read", A, 5.0), "bw_bytes_s_all": [5.0, 1.0, 1.0]},
        {**rec("read", B, 4.0), "bw_bytes_s_all": [4.0, 4.0, 3.9]},
    ]
    assert sp.config_of(sp.best_per_op(many)["read"]) == B


def test_balanced_score_never_exceeds_one() -> None:
    # the read best measured 10 in the sweep and 6 when re-measured; a configuration
    # measured once at 9 must not score 9/6 against it
    records = [
        rec("read", A, 10.0),
        rec("read", A, 6.0, phase="final"),
        rec("write", A, 5.0),
        rec("read", B, 9.0, phase="cross"),
        rec("write", B, 5.0),
    ]
    cfg, score = sp.balanced(records)  # type: ignore[misc]
    assert cfg == B and score == pytest.approx(1.0)
    for extra in ([rec("read", B, 20.0)], [rec("write", A, 50.0, phase="final")]):
        _, s = sp.balanced(records + extra)  # type: ignore[misc]
        assert 0 < s <= 1.0


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


def test_ops_are_read_or_write() -> None:
    sp.check_ops(("read", "write"))
    with pytest.raises(UsageError, match=r"--ops: trim, rw is not read or write"):
        sp.check_ops(("read", "trim", "rw"))


def test_choose_prefers_the_balanced_config_for_the_aio_block() -> None:
    records = [
        rec("read", A, 10.0),
        rec("write", A, 5.0),
        rec("read", B, 8.0),
        rec("write", B, 8.0),
    ]
    c = sweep_result.choose(records, use_gds=True)
    assert sp.config_of(c.best["read"]) == A and sp.config_of(c.best["write"]) == B
    assert c.balanced is not None and c.balanced[0] == B
    assert c.aio == {**sp.aio_block(B), "use_gds": True}


def test_choose_without_a_balanced_config_takes_the_best_point() -> None:
    c = sweep_result.choose([rec("read", A, 3.0), rec("read", B, 4.0)])
    assert c.balanced is None and c.aio == sp.aio_block(B)
    empty = sweep_result.choose([rec("read", A, 0.0, status="failed")])
    assert (empty.best, empty.balanced, empty.aio) == ({}, None, None)


def test_summary_counts_points_and_names_the_picks(tmp_path: Path) -> None:
    records = [
        rec("read", A, 10.0),
        rec("write", A, 5.0),
        rec("read", B, 8.0),
        rec("write", B, 8.0),
        rec("write", (4 * M, 8, 1, True, False), 0.0, status="timeout"),
    ]
    doc = sweep_result.summarize(
        tmp_path,
        "grid",
        records,
        use_gds=False,
        interrupted=False,
        budget_exhausted=True,
        ceilings=[{"key": "read/bs=1/qd=1"}],
    )
    assert list(doc) == [
        "out",
        "strategy",
        "points",
        "ok",
        "failed",
        "interrupted",
        "budget_exhausted",
        "best",
        "balanced",
        "aio",
        "ceilings",
        "fio_best",
    ]
    assert (doc["out"], doc["points"], doc["ok"], doc["failed"]) == (str(tmp_path), 5, 4, 1)
    assert doc["fio_best"] == {}  # the one ceiling has no bandwidth
    assert doc["balanced"] == {"config": sp.aio_block(B), "score": pytest.approx(0.8**0.5)}
    assert doc["aio"] == sp.aio_block(B) and doc["budget_exhausted"] is True


def test_finish_writes_result_json_that_aio_config_reads_back(tmp_path: Path) -> None:
    spec = SweepSpec(
        target=str(tmp_path / "not-there"),
        space=sp.Space(),
        io_size=M,
        repeats=1,
        strategy="adaptive",
        fio=False,
        gpu=False,
        gds=False,
        budget_s=None,
        point_timeout_s=60.0,
    )
    sweep = SimpleNamespace(spec=spec, budget_hit=False, ceilings={})
    records = [rec("read", A, 10.0), rec("write", A, 9.0)]
    doc = sweep_result.finish(sweep, tmp_path, records, interrupted=False, write_config=None)  # type: ignore[arg-type]
    assert doc["nvme_path_hints"] == [] and "config_written" not in doc
    assert json.loads((tmp_path / "result.json").read_text()) == doc
    aio, source = load_aio(str(tmp_path))
    assert aio == sp.aio_block(A) and source == str(tmp_path / "result.json")
    assert load_aio(None) == (None, "preset")


def test_aio_config_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        load_aio(str(tmp_path / "none.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UsageError, match="not JSON"):
        load_aio(str(tmp_path / "bad.json"))
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(UsageError, match='no "aio" block with a block_size'):
        load_aio(str(tmp_path / "list.json"))


def test_resume_needs_a_sweep_run_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"is not a sweep run directory \(no sweep.json\)"):
        load_spec(str(tmp_path))


def test_thread_sweep_needs_16_bytes_a_parameter_with_a_fifth_spare() -> None:
    sweep_threads.check_memory(10**9, "1B", 20 * 10**9)
    with pytest.raises(UsageError, match=r"2B parameters need 29.8 GiB of RAM \(16 bytes each\)"):
        sweep_threads.check_memory(2 * 10**9, "2B", 32 * 10**9)


def thread_row(threads: int, ms: float | None) -> dict[str, Any]:
    if ms is None:
        return {"threads": threads, "status": "failed", "error": "killed"}
    return {"threads": threads, "status": "ok", "step_ms_median": ms}


def test_thread_sweep_best_and_failure() -> None:
    rows = [thread_row(1, 90.0), thread_row(2, None), thread_row(4, 40.0), thread_row(8, 45.0)]
    best = sweep_threads.best_row(rows)
    assert best is not None and best["threads"] == 4
    assert sweep_threads.failure(rows) is None
    failed = [thread_row(1, None), thread_row(2, None)]
    assert sweep_threads.best_row(failed) is None
    err = sweep_threads.failure(failed)
    assert err is not None and err.exit_code == 1
    assert err.message == "no thread count succeeded"


def test_thread_sweep_json_exits_1_when_every_count_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        sweep_threads,
        "run_thread_sweep",
        lambda n, counts, repeats, on_row, ranks: [thread_row(1, None)],
    )
    r = CliRunner().invoke(
        cli_mod.cli,
        ["--json", "sweep-threads", "--params", "1K", "--threads", "1", "--no-memory"],
    )
    assert r.exit_code == 1
    assert json.loads(r.stdout)["best_threads"] is None
    assert r.stderr.splitlines() == [
        "iotune: error: no thread count succeeded",
        "hint: --debug shows the workers' errors",
    ]


def test_ranks_side_by_side_take_as_long_as_the_slowest_each_step() -> None:
    """Three ranks' step times, step by step: a step is its slowest rank's (the ranks meet
    at each step), and each rank's own median is kept; a rank's share is ZeRO's, rounded
    up."""
    times = [[10.0, 30.0, 20.0], [12.0, 11.0, 50.0], [9.0, 31.0, 19.0]]
    row = sweep_threads.rank_row(10, 2, 3, times)
    assert row == {
        "threads": 2,
        "ranks": 3,
        "params": 4,  # 10 parameters over 3 ranks: 4, 4 and 2 padded to 4
        "step_ms": [12.0, 31.0, 50.0],
        "step_ms_median": 31.0,
        "step_ms_min": 12.0,
        "step_ms_max": 50.0,
        "rank_step_ms_median": [20.0, 12.0, 19.0],
    }
    assert [sweep_threads.share(12, r) for r in (1, 2, 5, 12, 13)] == [12, 6, 3, 1, 1]


def test_the_best_thread_count_is_each_rank_counts_own() -> None:
    rows = [
        {**thread_row(1, 90.0), "ranks": 1},
        {**thread_row(2, 60.0), "ranks": 1},
        {**thread_row(1, 50.0), "ranks": 2},  # half the parameters each: not better
        {**thread_row(2, 55.0), "ranks": 2},
    ]
    assert sweep_threads.best_row(rows) == rows[1]  # the fewest ranks timed: one
    assert sweep_threads.best_row(rows, 2) == rows[2]
    assert sweep_threads.best_row(rows, 4) is None
    assert sweep_threads.best_row(rows[2:]) == rows[2]  # a sweep of two ranks only


def test_the_memory_probe_sizes_its_arrays_to_the_memory_and_says_its_best() -> None:
    from iotune.sweep.render import memory_line

    gib = 2**30
    assert sweep_threads.memory_elements(64 * gib) == 1 << 26  # 256 MiB arrays
    # 1 GiB available: a quarter of it in three arrays of 4-byte elements
    assert sweep_threads.memory_elements(gib) == gib // 4 // 12
    assert sweep_threads.memory_elements(0) == 1 << 20
    probe = {
        "elements": 1 << 26,
        "rows": [
            {"threads": 1, "copy_bytes_s": 20 * gib, "triad_bytes_s": 21 * gib},
            {"threads": 2, "copy_bytes_s": 30 * gib, "triad_bytes_s": 28 * gib},
            {"threads": 4, "copy_bytes_s": 29 * gib, "triad_bytes_s": 33 * gib},
        ],
    }
    assert memory_line(probe) == (
        "memory bandwidth (STREAM's count, 256 MiB arrays): triad 33.00 GiB/s at 4 thread(s), "
        "copy 30.00 GiB/s at 2 thread(s)"
    )
    assert memory_line({"error": "killed"}) == "memory bandwidth: not measured (killed)"


def test_sweep_threads_with_ranks_keeps_each_rank_counts_best(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    asked: dict[str, Any] = {}

    def sweep(n: int, counts: Any, repeats: int, on_row: Any, ranks: Any) -> list[Any]:
        asked.update(n=n, counts=counts, ranks=ranks)
        rows = [
            {**thread_row(1, 40.0), "ranks": 1, "params": n, "step_ms_min": 1, "step_ms_max": 2},
            {**thread_row(1, 30.0), "ranks": 2, "params": n // 2, "step_ms_min": 1,
             "step_ms_max": 2},
        ]  # fmt: skip
        for r in rows:
            on_row(r)
        return rows

    monkeypatch.setattr(sweep_threads, "run_thread_sweep", sweep)
    probe = {"elements": 1 << 20, "rows": [{"threads": 1, "copy_bytes_s": 2**30,
             "triad_bytes_s": 2**31}], "best": {"threads": 1, "triad_bytes_s": 2**31}}  # fmt: skip
    monkeypatch.setattr(sweep_threads, "run_memory_probe", lambda counts, available: probe)
    out = tmp_path / "run"
    r = CliRunner().invoke(
        cli_mod.cli,
        ["sweep-threads", "--params", "1K", "--threads", "1", "--ranks", "1,2", "--out", str(out)],
    )
    assert r.exit_code == 0, r.output
    assert asked == {"n": 1000, "counts": (1,), "ranks": (1, 2)}
    doc = json.loads((out / "threads.json").read_text())
    assert doc["best_threads"] == 1 and doc["best_threads_by_ranks"] == {"1": 1, "2": 1}
    assert doc["memory"] == probe
    assert "best: 1 thread(s), 30.0 ms per optimizer step for each of 2 ranks' 500 parameters" in (
        r.stdout
    )
    assert "triad 2.00 GiB/s at 1 thread(s)" in r.stdout
    bad = CliRunner().invoke(cli_mod.cli, ["sweep-threads", "--ranks", "0"])
    assert bad.exit_code == 2 and "--ranks: '0' is not a positive whole number" in bad.stderr


def test_fio_ceiling_keeps_as_many_requests_in_flight_as_the_aio_point() -> None:
    from iotune.sweep.fio import fio_argv

    argv = fio_argv(Path("/t"), "read", 512 * K, 16, 1024 * M, 3, jobs=4)
    assert "--numjobs=4" in argv and "--iodepth=16" in argv and "--group_reporting" in argv
    # each job its own quarter of the file, as DeepSpeed's threads split the buffer
    assert f"--size={256 * M}" in argv and f"--offset_increment={256 * M}" in argv


def test_best_aio_is_compared_with_fios_best_over_the_grid() -> None:
    best = sp.best_per_op([rec("read", A, 9.0), rec("write", A, 4.0)])
    ceilings = [
        {"op": "read", "block_size": M, "queue_depth": 32, "jobs": 4, "bw_bytes_s": 10.0},
        {"op": "read", "block_size": 512 * K, "queue_depth": 16, "jobs": 2, "bw_bytes_s": 12.0},
        {"op": "write", "block_size": M, "queue_depth": 32, "jobs": 4, "bw_bytes_s": 4.0},
    ]
    got = sweep_result.fio_best(best, ceilings)
    assert got["read"]["bw_bytes_s"] == 12.0 and got["read"]["jobs"] == 2
    assert got["read"]["aio_pct"] == pytest.approx(75.0)
    assert got["write"]["aio_pct"] == pytest.approx(100.0)
