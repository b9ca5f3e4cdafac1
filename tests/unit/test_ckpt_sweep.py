"""sweep-checkpoint's search, result and config merge (pure; the saves are the root tier's)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune.cli.app import cli
from iotune.records import append_record
from iotune.sweep import ckpt
from iotune.sweep.ckpt import DEFAULTS, Knobs, Space

pytestmark = pytest.mark.unit

SPACE = Space(
    io_buffer_size=(16 << 20, 64 << 20, 256 << 20),
    io_buffer_double=(True, False),
    block_size=(1 << 20, 4 << 20),
    queue_depth=(8, 32),
    threads=(1, 4),
)


def drive(k: Knobs) -> float:
    """A made-up volume: bigger buffers, more in flight, no CRC32 and no copy of the
    records help, a single buffer hurts."""
    inflight = min(k.queue_depth * k.threads, 32)
    t: float = 10.0 / (1 + k.io_buffer_size / (256 << 20)) / (inflight / 8) ** 0.5
    t *= (1.0 if k.io_buffer_double else 1.6) * (1.0 if k.crc32 else 0.7)
    return t * (1.25 if k.record_copy else 1.0)


def measure(stage: str, k: Knobs) -> dict[str, Any]:
    t = drive(k)
    return {
        "status": "ok",
        "durable_s": t,
        "blocked_s": t,
        "bytes": 12_000_000,
        "fill_s": 0.1 * t,
        "aio_write_s": 0.6 * t,
        "copy_s": 0.2 * t if k.record_copy else 0.0,
    }


def search(tmp: Path, records: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return ckpt.run_search(SPACE, records if records is not None else [], measure, tmp)


def test_the_search_starts_at_deepspeeds_defaults_and_keeps_the_fastest_per_knob(
    tmp_path: Path,
) -> None:
    recs = search(tmp_path)
    assert recs[0]["stage"] == "default" and ckpt.knobs_of(recs[0]) == DEFAULTS
    # the first round: one save per value of each stage, the value already best not saved
    # twice; a second round from its best, which finds nothing faster on this volume (its
    # knobs do not depend on each other), and the search ends
    first = [r for r in recs if r["round"] <= 1]
    assert len(first) == SPACE.size() == 1 + 1 + 1 + 2 + 1 + 1 + 1 + 1
    assert {r["round"] for r in recs} == {0, 1, 2}
    assert ckpt.fastest(first) is ckpt.fastest(recs)
    assert len({r["key"] for r in recs}) == len(recs)
    best = ckpt.fastest(recs)
    assert best is not None
    want = Knobs(
        crc32=False,
        record_copy=False,
        io_buffer_size=256 << 20,
        io_buffer_double=True,
        queue_depth=32,
        threads=1,
    )
    assert ckpt.knobs_of(best) == replace(DEFAULTS, **{k: v for k, v in asdict(want).items()})
    # the fastest of all the saves, and no knob of its stage faster
    assert best["durable_s"] == min(r["durable_s"] for r in recs)


def test_a_second_round_finds_what_the_first_could_not(tmp_path: Path) -> None:
    """A volume where more in flight pays only with a big buffer: the first round takes the
    buffer at queue depth 8, where it does not pay; the second, from queue depth 32, takes
    the big buffer; the third finds nothing faster, and the search ends."""

    def coupled(stage: str, k: Knobs) -> dict[str, Any]:
        deep = k.queue_depth >= 32
        big = k.io_buffer_size >= 256 << 20
        t = 10.0 * (0.9 if deep else 1.0) * (0.5 if deep and big else 1.0)
        t *= 1.0 if k.io_buffer_size == 64 << 20 or (deep and big) else 1.05
        return {**measure(stage, k), "durable_s": t, "blocked_s": t}

    recs = ckpt.run_search(SPACE, [], coupled, tmp_path)
    best = ckpt.fastest(recs)
    assert best is not None and (best["io_buffer_size"], best["queue_depth"]) == (256 << 20, 32)
    assert best["round"] == 2 and best["stage"] == "io_buffer_size"
    assert max(r["round"] for r in recs) == 3
    assert ckpt.next_point(SPACE, recs) is None
    gains = ckpt.stage_gains(recs)
    assert [(g["knob"], g["to"]) for g in gains] == [
        ("queue_depth", 32),
        ("io_buffer_size", 256 << 20),
    ]


def test_an_interrupted_search_resumes_with_the_same_points(tmp_path: Path) -> None:
    whole = search(tmp_path / "a")
    first = whole[:4]
    for r in first:
        append_record(tmp_path / "b" / ckpt.POINTS, r)
    again = ckpt.load_points(tmp_path / "b")
    assert again == first
    resumed = search(tmp_path / "b", again)
    assert [r["key"] for r in resumed] == [r["key"] for r in whole]
    assert ckpt.next_point(SPACE, resumed) is None


def test_failed_saves_are_never_best(tmp_path: Path) -> None:
    def failing(stage: str, k: Knobs) -> dict[str, Any]:
        return (
            {"status": "failed", "error": "x"}
            if k.io_buffer_size == 256 << 20
            else measure(stage, k)
        )

    recs = ckpt.run_search(SPACE, [], failing, tmp_path)
    best = ckpt.fastest(recs)
    assert best is not None and best["io_buffer_size"] != 256 << 20
    assert any(r["status"] == "failed" for r in recs)


def test_the_result_names_each_knob_that_helped_and_the_goal(tmp_path: Path) -> None:
    recs = search(tmp_path)
    recs.append(
        {"writer": "torch", "status": "ok", "blocked_s": 4.0, "durable_s": 6.0, "bytes": 12_000_000}
    )
    ceiling = {"bw_bytes_s": 12_000_000 / 4.0}
    res = ckpt.summarize(recs, ceiling)
    knobs = [g["knob"] for g in res["gains"]]
    assert knobs == ["crc32", "record_copy", "io_buffer_size", "queue_depth"]
    assert all(g["speedup"] > 1 for g in res["gains"])
    assert res["why"][0].startswith(
        "the default spent 1.00 s of its 10.00 s filling its 64 MiB buffer, 6.00 s waiting on "
        "writes of 1 MiB blocks with at most 8 in flight, 2.00 s copying each record before "
        "that (numpy.array in DeepSpeed's io/utils.py bytes_to_tensor), and 1.00 s in "
        "torch.save's own"
    )
    assert res["why"][0].endswith("it reached 40% of the volume's write ceiling")
    assert res["why"][1] == "torch.save's CRC32 on -> off: 1.43x faster to durable"
    assert res["why"][2] == "the writer's copy of each record on -> off: 1.25x faster to durable"
    assert "io_buffer_size 64 MiB -> 256 MiB" in res["why"][3]
    best_t = res["best"]["durable_s"]
    alone = (
        f"the best's writes alone ran at {100 * 12e6 / (0.6 * best_t) / 3e6:.0f}% of the ceiling; "
    )
    assert any(line.startswith(alone) for line in res["why"]), res["why"]
    assert res["script"] is not None and "set_crc32_options(False)" in res["script"]
    assert "bytes_to_tensor = lambda b: torch.frombuffer(b" in res["script"]
    best_s = res["best"]["durable_s"]
    assert res["goal"]["share_of_ceiling"] == pytest.approx(4.0 / best_s, rel=1e-3)
    assert res["goal"]["beats_torch_to_durable"] is (best_s < 6.0)
    assert res["goal"]["met"] is (4.0 / best_s >= 0.8 and best_s < 6.0)
    assert res["config"]["checkpoint"]["writer"] == {
        "type": "fast",
        "io_buffer_size": 256 << 20,
        "io_buffer_double": True,
    }
    assert res["config"]["aio"]["queue_depth"] == 32
    # a slower ceiling: the goal met where the tuned writer reaches 80% of it
    slow = ckpt.summarize(recs, {"bw_bytes_s": 0.9 * 12_000_000 / best_s})
    assert slow["goal"]["met"] is (best_s < 6.0)


def test_the_merge_keeps_the_offloads_aio_section_and_says_so() -> None:
    best = Knobs(io_buffer_size=256 << 20, queue_depth=32)
    fresh, note = ckpt.merge_checkpoint({"train_batch_size": 8}, best)
    assert note is None and fresh["aio"]["queue_depth"] == 32 and fresh["train_batch_size"] == 8
    existing: dict[str, Any] = {
        "aio": {"block_size": 1 << 20},
        "checkpoint": {"writer": {"decoupled": True}, "tag_validation": "Warn"},
    }
    merged, note = ckpt.merge_checkpoint(existing, best)
    assert merged["aio"] == {"block_size": 1 << 20}
    assert note is not None and '"queue_depth": 32' in note
    assert merged["checkpoint"]["writer"] == {"decoupled": True, **best.writer_section()}
    assert merged["checkpoint"]["tag_validation"] == "Warn"
    assert existing["checkpoint"]["writer"] == {"decoupled": True}  # a copy, not the input


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--params", "many"], "--params 'many' is not a parameter count"),
        (["--sub-group-size", "x"], "--sub-group-size 'x' is not a parameter count"),
        (["--io-buffer-size", "12K"], "--io-buffer-size 12288 is not a multiple of 8K"),
        (["--queue-depth", "0"], "--queue-depth: '0' is not a positive whole number"),
        (["--io-buffer-double", "maybe"], "'maybe' is not true or false"),
    ],
)
def test_bad_options_are_one_line_refusals(tmp_path: Path, args: list[str], message: str) -> None:
    res = CliRunner().invoke(cli, ["sweep-checkpoint", "--target", str(tmp_path), *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output
    assert not list(tmp_path.iterdir())


def test_a_config_that_cannot_be_merged_is_refused_first(tmp_path: Path) -> None:
    bad = tmp_path / "ds.json"
    bad.write_text("[1, 2]")
    res = CliRunner().invoke(
        cli, ["sweep-checkpoint", "--target", str(tmp_path), "--write-config", str(bad)]
    )
    assert res.exit_code == 2
    assert "does not hold a JSON object" in res.output
    assert json.loads(bad.read_text()) == [1, 2]
