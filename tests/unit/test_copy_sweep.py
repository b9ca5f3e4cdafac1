"""`sweep-checkpoint --copy-from` (iotune/sweep/copysweep.py, iotune/cli/copy_sweep.py): the
swap files counted by hand, the rounds' turns, a resumed run's skips, the medians and the
ratios within rounds, and the refusals. Pure logic and CliRunner; the root tier copies for
real (tests/root/test_swapcopy_root.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune.sweep import copysweep as cs


def test_the_swap_files_of_a_partition_counted_by_hand() -> None:
    # 25M parameters in sub-groups of 10M: 10M, 10M, 5M; three files each of 4 bytes a
    # parameter, rounded up to 32 KiB: 40,000,000 -> 1221 x 32768 = 40,009,728; 20,000,000
    # -> 611 x 32768 = 20,021,248
    assert cs.swap_sizes(25_000_000, 10_000_000) == [40_009_728] * 6 + [20_021_248] * 3
    assert cs.swap_sizes(8192, 10**9) == [32768] * 3  # 32 KiB each: exactly one unit
    assert cs.swap_sizes(8193, 10**9) == [65536] * 3
    assert cs.swap_sizes(0, 10) == []


def test_the_grid_and_the_rounds_turns() -> None:
    space = cs.CopySpace((1 << 20, 256 << 10), (32,), (1, 3))
    got = space.settings()
    assert [(s["block_size"], s["intra_op_parallelism"]) for s in got] == [
        (1 << 20, 1),
        (1 << 20, 3),
        (256 << 10, 1),
        (256 << 10, 3),
    ]
    # the chunk: 64 MiB, or the largest multiple of 4 KiB x 3 threads under it
    assert [s["chunk"] for s in got] == [64 << 20, 67_104_768, 64 << 20, 67_104_768]
    assert 67_104_768 % (4096 * 3) == 0 and 67_104_768 <= 64 << 20 < 67_104_768 + 4096 * 3
    pts = cs.points(space, reflink=False)
    assert [cs.label(p) for p in pts] == [
        "ceiling",
        "deepspeed",
        "aio 1 MiB qd 32 x1",
        "aio 1 MiB qd 32 x3",
        "aio 256 KiB qd 32 x1",
        "aio 256 KiB qd 32 x3",
    ]
    assert [cs.label(p) for p in cs.points(space, reflink=True)][:3] == [
        "ceiling",
        "deepspeed",
        "reflink",
    ]
    names = [cs.label(p) for p in cs.round_order(pts, 2)]
    assert names[:2] == ["aio 1 MiB qd 32 x1", "aio 1 MiB qd 32 x3"] and names[-1] == "deepspeed"
    assert cs.round_order(pts, 6) == pts and cs.round_order([], 3) == []


def _rec(point: dict[str, Any], r: int, seconds: float, size: int = 1000) -> dict[str, Any]:
    return {**point, "round": r, "status": "ok", "bytes": size, "durable_s": seconds}


def test_a_resumed_run_times_only_what_is_left_in_its_turns() -> None:
    pts = [{"copy": "ceiling"}, {"copy": "deepspeed"}, {"copy": "reflink"}]
    done = [_rec(pts[0], 0, 1.0), _rec(pts[1], 0, 2.0)]
    asked: list[str] = []
    kept: list[dict[str, Any]] = []

    def one(p: dict[str, Any]) -> dict[str, Any]:
        asked.append(p["copy"])
        return {"status": "ok", "bytes": 1000, "durable_s": 3.0}

    records = cs.run_rounds(pts, 2, done, one, kept.append)
    # round 0: the reflink left; round 1, turned by one: deepspeed, reflink, ceiling
    assert asked == ["reflink", "deepspeed", "reflink", "ceiling"]
    assert [(r["round"], r["copy"]) for r in kept] == [
        (0, "reflink"),
        (1, "deepspeed"),
        (1, "reflink"),
        (1, "ceiling"),
    ]
    assert records == [*done, *kept]


def test_the_summary_takes_medians_and_ratios_within_each_round() -> None:
    fast = {"block_size": 1 << 20, "queue_depth": 32, "intra_op_parallelism": 4, "chunk": 64 << 20}
    aio: dict[str, Any] = {"copy": "aio", "settings": fast}
    slow: dict[str, Any] = {"copy": "aio", "settings": {**fast, "queue_depth": 8}}
    ceil: dict[str, Any] = {"copy": "ceiling"}
    ds: dict[str, Any] = {"copy": "deepspeed"}
    gib = 2**30
    records = [
        # round 0: the disk fast; round 1: slow; round 2: in between
        _rec(ceil, 0, 1.0, gib), _rec(aio, 0, 1.25, gib), _rec(ds, 0, 2.5, gib),
        _rec(slow, 0, 4.0, gib),
        _rec(ceil, 1, 2.0, gib), _rec(aio, 1, 2.0, gib), _rec(ds, 1, 3.0, gib),
        _rec(slow, 1, 8.0, gib),
        _rec(ceil, 2, 1.5, gib), _rec(aio, 2, 1.6, gib), _rec(ds, 2, 4.8, gib),
        {**slow, "round": 2, "status": "failed", "error": "killed"},
    ]  # fmt: skip
    doc = cs.summarize(records)
    rows = {r["point"]: r for r in doc["rows"]}
    best = doc["best"]
    assert best is not None and best["point"] == "aio 1 MiB qd 32 x4"
    # the aio copy's medians: 1.6 s; 1 GiB over 1.25, 2.0, 1.6 s: 0.8, 0.5, 0.625 GiB/s
    assert best["durable_s"] == 1.6 and best["bw_bytes_s"] == pytest.approx(0.625 * gib)
    assert rows["aio 1 MiB qd 8 x4"]["rounds"] == 2 and rows["aio 1 MiB qd 8 x4"]["failed"] == 1
    assert rows["aio 1 MiB qd 8 x4"]["error"] == "killed"
    # within each round: rate / ceiling's rate = ceiling's seconds / aio's: 0.8, 1.0, 0.9375
    assert doc["of_ceiling"] == pytest.approx(0.9375)
    # and over DeepSpeed's: 2.0, 1.5, 3.0
    assert doc["over_deepspeed"] == pytest.approx(2.0)
    # not the ratio of the medians: DeepSpeed's median 3.0 s over the aio copy's 1.6 s
    assert rows["deepspeed"]["durable_s"] / best["durable_s"] == pytest.approx(1.875)
    none = cs.summarize([{**ceil, "round": 0, "status": "failed", "error": "x"}])
    assert none["best"] is None and none["of_ceiling"] is None


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli_mod.cli, ["sweep-checkpoint", *args])


def test_the_copy_sweeps_bad_input_is_one_line_each(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "in").mkdir()
    cases = [
        ((("--copy-from", str(a))), "--copy-from copies into --target, which is required"),
        (("--copy-from", str(tmp_path / "no"), "--target", str(b)), "is not a directory"),
        (("--copy-from", str(a), "--target", str(a)), "are one folder, or one holds the other"),
        (("--copy-from", str(a), "--target", str(a / "in")), "one holds the other"),
        (
            (
                "--copy-from",
                str(a),
                "--target",
                str(b),
                "--params",
                "1e14",
                "--sub-group-size",
                "1e13",
            ),
            "GiB free; the swap folder takes",
        ),
        (("--copy-from", str(a), "--target", str(b), "--threads", "0"), "--threads: '0'"),
    ]
    for args, message in cases:
        r = _cli(*args)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.stderr and r.stderr.count("\n") == 2, (args, r.stderr)
    assert list(b.iterdir()) == [] and sorted(p.name for p in a.iterdir()) == ["in"]
