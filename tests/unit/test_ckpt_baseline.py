"""Unit: a run that saved checkpoints to a volume of its own, as the baseline of a drives plan
(``iotune estimate --drives --baseline RUN``). The checkpoint volume's drives are traced with
the run's, but DeepSpeed swapped to the offload drives only: one drive's bandwidth is the
swaps' over those, as for the same run without checkpoints, and as older run documents
(whose ``drives`` named both volumes) read too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune.model.dsconfig import ds_config
from iotune.model.estimate import estimate
from iotune.model.presets import get_preset
from iotune.plan.rundoc import volume_drives
from iotune.trace.targets import Targets
from iotune.train.preflight import Resources
from iotune.train.request import Prepared, RunRequest
from iotune.train.results import build_result, write_result

DATA = Path(__file__).resolve().parent.parent / "data"
#: the seconds each step's swaps took (iotune.workers.train.SwapClock)
SWAPS = {
    "grad_out_s": 0.02,
    "swap_in_s": 0.5,
    "grad_flush_s": 0.1,
    "swap_out_s": 0.3,
    "backward_grad_out_s": 0.0,
}


def _run(tmp_path: Path, name: str, checkpoint_drives: tuple[str, ...]) -> Path:
    """run.json as build_result writes it from the recorded tiny_opt_nvme run's steps, each
    with its swap timings; with *checkpoint_drives*, a save after step 2 on them."""
    out = tmp_path / name
    shutil.copytree(DATA / "run-tiny-opt-nvme", out)
    events = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    events = [e | SWAPS if e["event"] == "step" else e for e in events]
    if checkpoint_drives:
        events.append(
            {"event": "checkpoint", "step": 2, "tag": "step2", "writer": "torch"}
            | {"blocked_s": 1.0, "durable_s": 2.0, "files": 5, "bytes": 10, "swap_copy_bytes": 8}
        )
    (out / "steps.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    p = get_preset("tiny_opt_nvme")
    cfg = ds_config(p, "/mnt/x/iotune-swap-run")
    prep = Prepared(
        p,
        cfg,
        estimate(p, cfg),
        Resources(None, None, 2**34, 2**34),
        [],
        Path("/mnt/x"),
        Path("/mnt/x/iotune-swap-run"),
        Targets(disks=("loop0", *checkpoint_drives)),
        offload_drives=("loop0",),
        checkpoint_drives=checkpoint_drives,
    )
    trace = json.loads((out / "trace.json").read_text())
    write_result(out, build_result(RunRequest(preset=p, out=out, backend="bcc"), prep, trace, 0.0))
    return out


def _one_drive_read(run: Path) -> float:
    r = CliRunner().invoke(
        cli_mod.cli,
        ["--json", "estimate", "tiny_opt_nvme", "--baseline", str(run), "--drives", "1,2"],
        prog_name="iotune",
    )
    assert r.exit_code == 0, r.output
    limits = json.loads(r.output)["drives"]["limits"]
    (one,) = [x for x in limits if x["what"] == "one drive, read (measured)"]
    return float(one["value"])


def test_a_run_that_saved_elsewhere_gives_one_drive_the_swaps_bandwidth(tmp_path: Path) -> None:
    plain = _run(tmp_path, "plain", ())
    saved = _run(tmp_path, "saved", ("loop1",))
    doc: dict[str, Any] = json.loads((saved / "run.json").read_text())
    assert doc["drives"] == ["loop0"]  # the drives the run swapped to
    assert doc["checkpoints"]["checkpoint_drives"] == ["loop1"]
    # the hand count: the state and gradients swapped in (12 N_s + 4 N_g) over swap_in_s
    # without its wait for the gradients' flush, on the one offload drive
    sw = doc["estimate"]["swapped"]
    want = (12 * sw["n_s"] + 4 * sw["n_g"]) / (SWAPS["swap_in_s"] - SWAPS["grad_flush_s"])
    assert _one_drive_read(plain) == pytest.approx(want, rel=1e-9)
    assert _one_drive_read(saved) == pytest.approx(want, rel=1e-9)


def test_an_older_run_document_that_named_both_volumes_reads_the_same(tmp_path: Path) -> None:
    saved = _run(tmp_path, "saved", ("loop1",))
    doc = json.loads((saved / "run.json").read_text())
    # as run.json was written before: every traced drive, the checkpoint volume's too
    doc["drives"] = ["loop0", "loop1"]
    (saved / "run.json").write_text(json.dumps(doc))
    assert volume_drives(doc) == 1
    plain = _run(tmp_path, "plain", ())
    assert _one_drive_read(saved) == pytest.approx(_one_drive_read(plain), rel=1e-9)
