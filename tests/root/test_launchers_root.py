"""Root tier: a user's training as users launch it, traced with `iotune trace --model M
--ds-config C -- LAUNCHER ...`: DeepSpeed's own launcher, torchrun, `accelerate launch` with
its DeepSpeed plugin, and a transformers.Trainer script given a config full of "auto"
(filled by iotune as the Trainer fills it) under gradient accumulation. Each on the CPU
(gloo), the optimizer state on an ext4 loop device: the steps found are the script's own
optimizer steps, and every read is the model's."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from iotune.proc import worker_env
from tests.root.conftest import iotune
from tests.root.test_custom_root import DATA, FS_WRITES, _offload_dir, script_ended

BIN = Path(sys.executable).parent
MODEL = str(DATA / "gpt_neox")
SEQ = "128"
STEPS = 3


def _port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _config(name: str, mnt: Path, tmp_path: Path) -> Path:
    cfg = json.loads((DATA / name).read_text())
    cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] = str(mnt / "swap")
    if name == "opt_nvme.json":
        cfg["train_micro_batch_size_per_gpu"] = 2
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(cfg))
    return path


def _launch(launcher: str, ds: Path) -> tuple[list[str], list[str]]:
    """The user's command, and what iotune is told of the batch (as the user would)."""
    script = [str(DATA / "train_script.py"), MODEL, str(ds), str(STEPS), SEQ]
    if launcher == "deepspeed":
        # DeepSpeed's launcher on this CPU host: one rank (DS_ACCELERATOR=cpu)
        return [
            str(BIN / "deepspeed"),
            *("--num_gpus", "1", "--hostfile", "/dev/null", "--master_port", _port()),
            *script,
        ], []
    if launcher == "torchrun":
        return [
            sys.executable,
            *("-m", "torch.distributed.run", "--nproc_per_node", "1"),
            *("--master_port", _port()),
            *script,
        ], []
    if launcher == "accelerate":
        return [
            str(BIN / "accelerate"),
            *("launch", "--use_deepspeed", "--deepspeed_config_file", str(ds)),
            *("--num_processes", "1", "--num_machines", "1", "--main_process_port", _port()),
            *("--mixed_precision", "no", "--dynamo_backend", "no"),
            *(str(DATA / "accel_script.py"), MODEL, str(STEPS), SEQ),
        ], []
    # the Trainer: 2 sequences a micro-step, 2 micro-steps an optimizer step, float32 (its
    # TrainingArguments leave bf16 off)
    return [
        sys.executable,
        *(str(DATA / "trainer_script.py"), MODEL, str(ds), str(STEPS), SEQ, "2", "2"),
    ], ["--micro-batch", "2", "--ga", "2", "--set", "dtype=fp32"]


@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun", "accelerate", "trainer"])
def test_a_launched_script_is_traced_step_by_step_with_the_models_bytes(
    launcher: str, loop_device: Callable[..., str], tmp_path: Path
) -> None:
    mnt = _offload_dir(loop_device)
    name = "hf_zero3_nvme.json" if launcher == "trainer" else "opt_nvme.json"
    ds = _config(name, mnt, tmp_path)
    command, told = _launch(launcher, ds)
    p = iotune(
        "--json",
        "trace",
        *("--model", MODEL, "--ds-config", str(ds), "--seq-len", SEQ, *told),
        *("--set", "accelerator=cpu", "--out", str(tmp_path / "t"), "--"),
        *command,
        env={**worker_env(), "DS_ACCELERATOR": "cpu"},
        check=False,
    )
    script_ended(p, STEPS)
    doc: dict[str, Any] = json.loads(p.stdout)
    s = doc["script"]
    assert s["initialised"] and s["steps_found"] == STEPS, (launcher, s)
    assert s["late_cuts"] == 0 and not s["events_lost"], s
    assert [r["label"] for r in s["rows"]] == ["init:0", "step:1", "step:2", "step:3"]
    for r in s["rows"]:
        assert r["measured"]["read"] == r["predicted"]["read"], (launcher, r)
        assert 0 <= r["measured"]["write"] - r["predicted"]["write"] <= 2 * FS_WRITES, r
    if launcher == "trainer":
        # 6 micro-steps, 3 optimizer steps: the Trainer said so, and so did the swap folder
        assert f"{STEPS}/{STEPS}" in p.stderr, p.stderr[-2000:]
