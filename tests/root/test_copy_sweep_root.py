"""Root tier: `iotune sweep-checkpoint --copy-from`, the save's copy of NVMe-offloaded state
swept for real between two folders of one XFS volume (so that reflink is among the copies):
the raw O_DIRECT ceiling, DeepSpeed's copytree, reflink and iotune's aio copy at two settings,
two rounds in turns. Every copy's bytes are the swap files' counted by hand, the result's
medians and ratios are computed again from the records, nothing is left on the volume, and a
resumed run times nothing it has."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.root.conftest import LoopDevices, iotune

pytestmark = pytest.mark.beside_study

#: 20M parameters in sub-groups of 10M: six files of 40,000,000 bytes rounded up to 32 KiB
SWAP_BYTES = 6 * 1221 * 32768


def _label(r: dict[str, Any]) -> str:
    s = r.get("settings")
    return (
        r["copy"]
        if not s
        else f"aio {s['block_size'] >> 20} MiB qd {s['queue_depth']} x{s['intra_op_parallelism']}"
    )


def test_the_copy_sweep_times_each_copy_to_the_byte_and_its_ratios_add_up(
    tmp_path: Path,
) -> None:
    devs = LoopDevices(tmp_path)
    try:
        devs(size_mib=1024, fs="xfs", mount=True)
        vol = devs.mounts[-1]
        off, ck, run = vol / "offload", vol / "ckpt", tmp_path / "run"
        off.mkdir()
        ck.mkdir()
        args: tuple[str, ...] = ("--copy-from", str(off), "--target", str(ck), "--params", "20M")
        args += ("--sub-group-size", "1e7", "--block-size", "1M", "--queue-depth", "8,32")
        args += ("--threads", "4", "--rounds", "2", "--out", str(run))
        doc = json.loads(iotune("--json", "sweep-checkpoint", *args).stdout)
        assert json.loads((run / "copy.json").read_text()) == doc
        recs = [json.loads(x) for x in (run / "copy_points.jsonl").read_text().splitlines()]
        names = ["ceiling", "deepspeed", "reflink", "aio 1 MiB qd 8 x4", "aio 1 MiB qd 32 x4"]
        assert sorted((r["round"], _label(r)) for r in recs) == sorted(
            (k, n) for k in (0, 1) for n in names
        )
        # the second round turned by one: it starts with the first round's second copy
        assert [_label(r) for r in recs[5:]] == [*names[1:], names[0]]
        for r in recs:
            assert r["status"] == "ok" and r["bytes"] == SWAP_BYTES, r
            assert r.get("same", True) is True
            assert 0 < r["blocked_s"] <= r["durable_s"]
        assert (doc["bytes"], doc["files"], doc["reflink"]) == (SWAP_BYTES, 6, True)
        rows = {r["point"]: r for r in doc["rows"]}
        for name in names:
            mine = [r for r in recs if _label(r) == name]
            assert rows[name]["durable_s"] == statistics.median(r["durable_s"] for r in mine)
            assert rows[name]["rounds"] == 2
        best = max((r for r in doc["rows"] if r["copy"] == "aio"), key=lambda r: r["bw_bytes_s"])
        assert doc["best"] == best

        def ratio(a: str, b: str) -> float:
            return float(
                statistics.median(
                    next(r["durable_s"] for r in recs if r["round"] == k and _label(r) == b)
                    / next(r["durable_s"] for r in recs if r["round"] == k and _label(r) == a)
                    for k in (0, 1)
                )
            )

        assert doc["of_ceiling"] == pytest.approx(ratio(best["point"], "ceiling"))
        assert doc["over_deepspeed"] == pytest.approx(ratio(best["point"], "deepspeed"))
        # nothing left of the swap files or their copies
        assert list(off.iterdir()) == [] and list(ck.iterdir()) == []
        again = json.loads(iotune("--json", "sweep-checkpoint", "--resume", str(run)).stdout)
        assert again["rows"] == doc["rows"] and len(
            (run / "copy_points.jsonl").read_text().splitlines()
        ) == len(recs)
        assert list(off.iterdir()) == []  # all timed: the swap files not even written
    finally:
        devs.close()
