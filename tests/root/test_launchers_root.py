"""Root tier: a user's training as users launch it, traced with `iotune trace --target DIR --
LAUNCHER ...` and nothing else: DeepSpeed's own launcher, torchrun, `accelerate launch` with
DeepSpeed set up in accelerate's YAML (no DeepSpeed JSON), and a transformers.Trainer
script with a config full of "auto" under gradient accumulation. The run's own processes
tell iotune their resolved config, world size, batch, dtype and model (iotune/hook); each
on the CPU (gloo), the optimizer state on an ext4 loop device: the steps found are the
script's own optimizer steps, and every read is the model's, to the byte. One run is also
given --model/--ds-config and a micro-batch the run does not use: the line names it, and
the run's own figures are the ones beside its steps."""

from __future__ import annotations

import itertools
import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from iotune.proc import worker_env
from iotune.train.script import print_script
from tests.root.conftest import iotune
from tests.root.test_custom_root import DATA, FS_WRITES, _offload_dir, script_ended

BIN = Path(sys.executable).parent
MODEL = str(DATA / "gpt_neox")
#: the tiny GPT-NeoX's parameters, as transformers builds it (the estimate's N)
N = 3_677_184
SEQ = "128"
STEPS = 3
#: what ext4 reads of its own metadata (directories, bitmaps) for the swap folders a run makes
FS_META_READS = 64 * 1024


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


#: accelerate's YAML as `accelerate config` writes it for ZeRO-3 with the optimizer state on
#: NVMe (accelerate's docs, "DeepSpeed": deepspeed_config with zero_stage, offload_*_device,
#: offload_optimizer_nvme_path, gradient_accumulation_steps, ...), on one CPU process
ACCELERATE_YAML = """\
compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 1
  gradient_clipping: 1.0
  offload_optimizer_device: nvme
  offload_optimizer_nvme_path: {nvme}
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 3
distributed_type: DEEPSPEED
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 1
rdzv_backend: static
same_network: true
use_cpu: false
"""


def _launch(launcher: str, mnt: Path, tmp_path: Path) -> list[str]:
    """The user's command, as they would type it."""
    if launcher == "accelerate":
        yaml = tmp_path / "acc.yaml"
        # the swap folder the YAML names, off the traced drive: accelerate launch does not hand
        # it to DeepSpeed, which swaps to ./none under the folder the command starts in
        yaml.write_text(ACCELERATE_YAML.format(nvme=tmp_path / "yaml-swap"))
        return [
            *("env", "-C", str(mnt), str(BIN / "accelerate"), "launch"),
            *("--config_file", str(yaml), "--main_process_port", _port()),
            *(str(DATA / "accel_script.py"), MODEL, str(STEPS), SEQ, "2"),
        ]
    if launcher == "trainer":
        # 2 sequences a micro-step, 2 micro-steps an optimizer step, float32 (its
        # TrainingArguments leave bf16 off), all "auto" in its config
        ds = _config("hf_zero3_nvme.json", mnt, tmp_path)
        return [
            sys.executable,
            *(str(DATA / "trainer_script.py"), MODEL, str(ds), str(STEPS), SEQ, "2", "2"),
        ]
    ds = _config("opt_nvme.json", mnt, tmp_path)
    script = [str(DATA / "train_script.py"), MODEL, str(ds), str(STEPS), SEQ]
    if launcher == "deepspeed":
        # DeepSpeed's launcher on this CPU host: one rank (DS_ACCELERATOR=cpu)
        return [
            str(BIN / "deepspeed"),
            *("--num_gpus", "1", "--hostfile", "/dev/null", "--master_port", _port()),
            *script,
        ]
    if launcher == "torchrun":
        return [
            sys.executable,
            *("-m", "torch.distributed.run", "--nproc_per_node", "1"),
            *("--master_port", _port()),
            *script,
        ]
    return [sys.executable, *script]


def _trace(mnt: Path, tmp_path: Path, told: list[str], command: list[str]) -> Any:
    p = iotune(
        "--json",
        "trace",
        *("--target", str(mnt), *told, "--out", str(tmp_path / "t"), "--"),
        *command,
        env={**worker_env(), "DS_ACCELERATOR": "cpu"},
        check=False,
    )
    script_ended(p, STEPS)
    return p, json.loads(p.stdout)


def _exact(doc: dict[str, Any], launcher: str) -> dict[str, Any]:
    s: dict[str, Any] = doc["script"]
    assert s["estimate_from"] == "run" and s["params"] == N, (launcher, s)
    assert s["initialised"] and s["steps_found"] == STEPS, (launcher, s)
    assert s["late_cuts"] == 0 and not s["events_lost"], s
    assert [r["label"] for r in s["rows"]] == ["init:0", "step:1", "step:2", "step:3"]
    rows = s["rows"]
    for op, extra in (("read", FS_META_READS), ("write", len(rows) * 2 * FS_WRITES)):
        # the swap folders are made inside the run (where a --model trace makes them before
        # it starts): ext4 reads a few blocks of its metadata for them during initialisation,
        # and writes its journal beside the steps
        over = [r["measured"][op] - r["predicted"][op] for r in rows]
        # the whole run to the byte (within the file system's own), wherever the cuts fell
        assert 0 <= sum(over) <= extra, (launcher, op, over)
        # each interval exact, or cut late: a user's process does not wait for the tracer's
        # sample at its step events as iotune's own workers do, and on a busy host the swap
        # folder's watch can cut after the next step's first requests, which then count in
        # the step before and are missing, to the byte, from their own. A cut never takes
        # bytes from the steps before it: no running sum is below zero
        running = list(itertools.accumulate(over))
        assert min(running) >= 0, (launcher, op, over)
    return s


@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun", "accelerate", "trainer"])
def test_a_launched_script_tells_its_own_config_and_is_traced_with_the_models_bytes(
    launcher: str, loop_device: Callable[..., str], tmp_path: Path
) -> None:
    mnt = _offload_dir(loop_device)
    p, doc = _trace(mnt, tmp_path, [], _launch(launcher, mnt, tmp_path))
    s = _exact(doc, launcher)
    run = doc["learned"]["run"]
    assert run["world_size"] == 1 and run["dtype"] == "fp32", run
    assert run["engines_reported"] == 1 and run["architecture"] == "GPTNeoXForCausalLM", run
    # the aio block the run's config gives DeepSpeed (accelerate's YAML none: DeepSpeed's 1 MiB)
    block = {"accelerate": "1M", "trainer": "256K"}.get(launcher)
    assert doc["learned"]["notes"] == (
        [
            f"the run's aio block_size is {block}; this trace counted requests of 512K apart "
            f"(--focus-size {block} counts its blocks)"
        ]
        if block
        else []
    ), doc["learned"]
    assert s["disagreement"] is None, s
    # DeepSpeed's CPU allreduce workspaces (/dev/shm, 66 MiB a rank, left by its ranks) are
    # gone with the run: iotune removes those of the port the ranks reported
    from iotune.workers.launch import shm_workspaces

    ports = {
        json.loads(e.read_text())["master_port"]
        for e in (tmp_path / "t" / "learn").glob("engine-rank*.json")
    }
    assert ports and all(ports), ports
    assert [f for port in ports for f in shm_workspaces(port)] == []
    if launcher == "accelerate":
        # the batch from the DataLoader, the swap folder where DeepSpeed really put it
        assert run["micro_batch"] == 2 and run["optimizer_nvme_path"] == "none", run
        assert s["nvme_path"] == str(mnt / "none"), s
        assert (mnt / "none" / "zero_stage_3" / "optimizer").is_dir()
        assert not (tmp_path / "yaml-swap").exists()
    elif launcher == "trainer":
        # its "auto" values as transformers filled them; 6 micro-steps, 3 optimizer steps
        assert (run["micro_batch"], run["ga"], run["train_batch_size"]) == (2, 2, 4), run
        cfg = json.loads((tmp_path / "t" / "learn" / "ds_config.json").read_text())
        zo = cfg["zero_optimization"]
        assert zo["reduce_bucket_size"] == 256 * 256, zo
        assert zo["stage3_param_persistence_threshold"] == 10 * 256, zo
        assert f"{STEPS}/{STEPS}" in p.stderr, p.stderr[-2000:]
    else:
        assert (run["micro_batch"], run["ga"]) == (2, 1), run


def test_a_figure_the_run_did_not_use_is_named_and_the_runs_own_is_beside_the_steps(
    loop_device: Callable[..., str], tmp_path: Path
) -> None:
    """--model/--ds-config plan the drives and the swap folder's watch before the run; the
    run says its micro-batch is the config's 2, not --micro-batch 1: one line says so, and
    the estimate beside the steps is the run's own (the bytes do not depend on it)."""
    mnt = _offload_dir(loop_device)
    command = _launch("python", mnt, tmp_path)
    told = ["--model", MODEL, "--ds-config", str(tmp_path / "ds.json"), "--micro-batch", "1"]
    _, doc = _trace(mnt, tmp_path, [*told, "--seq-len", SEQ, "--set", "accelerator=cpu"], command)
    s = _exact(doc, "python")
    assert s["disagreement"] == (
        "the run's own figures differ from what iotune was told: micro-batch 2 (told 1); the "
        "estimate beside the steps is the run's"
    ), s
    con = Console(record=True, width=100)
    print_script(con, s)
    line = con.export_text().splitlines()[-1]
    assert line == f"note: {s['disagreement']}", con.export_text()


def test_a_users_save_under_the_trace_copies_the_swap_files_by_aio(
    loop_device: Callable[..., str], tmp_path: Path
) -> None:
    """docs/commands/run.md's line for a user's own script, `with swap_copies("aio"):
    engine.save_checkpoint(...)`, under `iotune trace -- deepspeed ...`: in the launched rank
    the save's copy of the swap folder goes by iotune's aio copy, every file byte for byte
    onto the checkpoint volume (another drive), `latest` naming the save; the trace reads every
    byte of the swap files once more than the model's steps read, O_DIRECT, to the byte."""
    import filecmp

    mnt = _offload_dir(loop_device)
    loop_device(size_mib=256, fs="ext4", mount=True)
    ck = Path(loop_device.mounts[-1]) / "ckpt"  # type: ignore[attr-defined]
    p = iotune(
        *("--json", "trace", "--target", str(mnt), "--out", str(tmp_path / "t"), "--"),
        *_launch("deepspeed", mnt, tmp_path),
        env={**worker_env(), "DS_ACCELERATOR": "cpu", "SAVE_DIR": str(ck)},
        check=False,
    )
    script_ended(p, STEPS)
    copies = [json.loads(x[6:]) for x in p.stderr.splitlines() if x.startswith("copy: ")]
    assert [c["copy"] for c in copies] == ["aio"], p.stderr[-3000:]
    swap, into = Path(copies[0]["source"]), Path(copies[0]["target"])
    # the optimizer's state, as DeepSpeed copies it (not its gradients' swap files): the fp32
    # master and Adam's two moments, 4 bytes a parameter each, in one sub-group
    files = sorted(f.relative_to(into) for f in into.rglob("*") if f.is_file())
    size = sum((into / f).stat().st_size for f in files)
    assert (copies[0]["files"], copies[0]["bytes"]) == (len(files), size) == (3, 12 * N)
    assert into.is_relative_to(ck / f"step{STEPS}")
    assert all(filecmp.cmp(swap / f, into / f, shallow=False) for f in files)
    assert (ck / "latest").read_text() == f"step{STEPS}"
    # the trace of the offload volume: past the steps' rows (the save follows the last step),
    # the whole trace read the copy's bytes once more, O_DIRECT, to the byte but for ext4's own
    # metadata, and wrote nothing but ext4's (the checkpoint is on the other drive)
    doc = json.loads(p.stdout)
    (dev,) = doc["devices"]
    assert dev["check"]["exact"], dev["check"]
    rows = doc["script"]["rows"]
    after = {
        op: dev[op]["bytes"] - sum(r["measured"][op] for r in rows) for op in ("read", "write")
    }
    assert size <= after["read"] <= size + FS_META_READS, (size, after, rows)
    assert 0 <= after["write"] <= FS_WRITES, (after, rows)
