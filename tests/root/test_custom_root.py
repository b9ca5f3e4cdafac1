"""Root tier: your model and your DeepSpeed config (--model, --ds-config). Three tiny CPU
models of architectures other than Llama (tests/data/custom: GPT-NeoX with biases and a
fused QKV, Phi-3 with fused QKV and gate/up, Mixtral with its experts fused into 3-D
parameters, Qwen2 with GQA and a tied embedding) train
under the real DeepSpeed ZeRO-3 on an ext4 loop device, traced by the real eBPF program: the
estimate from each model's own tensors is DeepSpeed's swap files and bytes, to the byte. A
plain training script of a user's is traced with its steps found in the swap folder. Bad
configs get one line and a hint."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from iotune.proc import worker_env
from tests.io_rules import PAGES, param_reads_shift_ok
from tests.root.conftest import iotune, iotune_json

DATA = Path(__file__).resolve().parent.parent / "data" / "custom"
#: what writes move beyond DeepSpeed's files: ext4's journal and metadata
FS_WRITES = 256 * 1024
SEQ = "32"
#: all but the script's test run beside the vm tier's study (tests/conftest.py): the worker
#: waits at each step's event until the tracer has sampled it, where a script's steps are
#: found by the swap folder's watch, when it looks
beside_study = pytest.mark.beside_study


#: libstdc++'s words when DeepSpeed's async I/O race aborts a script's shutdown
SHUTDOWN_ABORT = "terminate called without an active exception"


def script_ended(p: subprocess.CompletedProcess[str], steps: int) -> None:
    """A traced script ended well, or after its *steps* in DeepSpeed's shutdown race: an
    async I/O thread frees a finished request's pinned buffer once the script's Python has
    begun to shut down, must take the GIL, and the interpreter aborts it (about one run in
    ten on a loaded 2-core host: gdb showed io_op_desc_t's destructor on an AIO thread in
    take_gil, the main thread in finalisation's gc). The script's status is passed on (134
    run directly; a launcher's own for its child's SIGABRT), iotune's line says when, and
    its hint that the steps are whole."""
    if p.returncode == 0:
        return
    tail = p.stderr[-3000:]
    assert SHUTDOWN_ABORT in p.stderr, tail
    assert f"after {steps} steps; the trace above is what ran until then" in p.stderr, tail
    assert f"the {steps} traced steps are whole" in p.stderr, tail


def _offload_dir(loop_device: Callable[..., str]) -> Path:
    dev = loop_device(size_mib=1024, fs="ext4", mount=True)
    # DeepSpeed's 512 KiB requests whole, as on an NVMe drive (a loop device merges two)
    Path(f"/sys/block/{Path(dev).name}/queue/max_sectors_kb").write_text("512")
    return Path(loop_device.mounts[-1])  # type: ignore[attr-defined]


def _swap_files_bytes(doc: dict[str, Any]) -> int:
    return int(max(e["swap"]["apparent"] for e in doc["events"] if e.get("swap")))


def _trace(model: str, cfg: str, mnt: Path, out: Path) -> dict[str, Any]:
    doc: dict[str, Any] = iotune_json(
        "trace",
        *("--model", str(DATA / model), "--ds-config", str(DATA / cfg)),
        *("--set", "accelerator=cpu", "--seq-len", SEQ, "--steps", "3"),
        *("--nvme-path", str(mnt), "--out", str(out)),
    )
    assert doc["exit_code"] == 0 and doc["steps_done"] == 3, doc.get("error")
    # a NaN loss makes DeepSpeed skip the optimizer step (weights left uninitialised do it)
    losses = [e["loss"] for e in doc["events"] if e.get("event") == "step"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses), losses
    return doc


@beside_study
@pytest.mark.parametrize(
    ("model", "cfg"),
    [
        ("phi3", "opt_nvme.json"),
        ("mixtral", "opt_nvme.json"),
        ("gpt_neox", "params_opt_nvme.json"),
    ],
)
def test_your_model_moves_the_estimated_bytes(
    model: str, cfg: str, loop_device: Callable[..., str], tmp_path: Path
) -> None:
    """The optimizer state on NVMe: every read to the byte. The parameters too: their files
    join, and a step reads the model's bytes give or take whole files, as for the presets
    (tests/io_rules.py), this model's files (its own tensors', padded to pages). The parameter config turns DeepSpeed's prefetch off: with
    it, DeepSpeed 0.19.8 fails these untied models' second step ("param 27 already assigned
    swap buffer id 18": the output layer prefetched twice)."""
    mnt = _offload_dir(loop_device)
    doc = _trace(model, cfg, mnt, tmp_path / "r")
    est = doc["estimate"]
    meta = json.loads((tmp_path / "r" / "preset.json").read_text())["geometry"]
    # the model's own tensors, as transformers built them: not a Llama
    assert meta["type_name"] == model and len(meta["params"]) > 10
    assert est["params"] == sum(n for _, n in meta["params"])
    assert _swap_files_bytes(doc) == est["nvme_bytes"]
    params = est["swapped"]["n_p"]
    first = doc["io_steps"][0]["read"]["bytes"] + doc["io_steps"][1]["read"]["bytes"]
    off = first - est["init"]["read"] - est["first_step"]["read"]
    assert param_reads_shift_ok(off, params, PAGES) if params else off == 0, off
    for s in doc["io_steps"][2:]:
        assert 0 <= s["write"]["bytes"] - est["steady_step"]["write"] <= FS_WRITES, s["label"]
        off = s["read"]["bytes"] - est["steady_step"]["read"]
        if params:
            assert param_reads_shift_ok(off, params, PAGES), (s["label"], off)
        else:
            assert off == 0, s["label"]
    assert bool(params) == (cfg == "params_opt_nvme.json")


@beside_study
def test_a_tied_model_with_parameters_on_nvme_leaves_the_orphan_file(
    loop_device: Callable[..., str], tmp_path: Path
) -> None:
    """Qwen2 with tie_word_embeddings: zero.Init swaps out lm_head's own weight before
    transformers ties it to the embedding, and the estimate counts that file: the swap
    files are the estimate's, to the byte, and so are the writes. A step reads the tied
    weight's file 0, 1 or 2 times (DeepSpeed keeps it gathered between its two uses, or
    fetches it again; all three seen), where the estimate counts one and says so."""
    mnt = _offload_dir(loop_device)
    doc = _trace("qwen2_tied", "params_opt_nvme.json", mnt, tmp_path / "r")
    est = doc["estimate"]
    meta = json.loads((tmp_path / "r" / "preset.json").read_text())["geometry"]
    assert [n for n, _ in meta["tied"]] == ["lm_head.weight"]
    assert _swap_files_bytes(doc) == est["nvme_bytes"]
    assert any("tied weights" in c for c in est["caveats"])
    sw = est["swapped"]
    optimizer = 12 * sw["n_s"] + 4 * sw["n_g"]
    ((_, tied),) = meta["tied"]
    # the embedding is the one parameter big enough to be swapped: one fetch of it counted
    tied_file = est["steady_step"]["read"] - optimizer
    assert tied_file == 4 * tied == 4 * sw["n_p"]  # no bf16 in the config: float32 files
    for s in doc["io_steps"][2:]:
        assert 0 <= s["write"]["bytes"] - est["steady_step"]["write"] <= FS_WRITES, s["label"]
        fetches, rest = divmod(s["read"]["bytes"] - optimizer, tied_file)
        assert rest == 0 and fetches in (0, 1, 2), (s["label"], fetches, rest)


def test_your_own_script_is_traced_step_by_step_beside_the_estimate(
    loop_device: Callable[..., str], tmp_path: Path
) -> None:
    """A script iotune did not write and cannot change: its steps are cut where DeepSpeed
    has rewritten every optimizer file, and the reads of the whole run are the estimate's.
    Four sub-groups, and an initialisation slowed by a second between its two rounds of
    writes (on a GPU the pause is that long): the cut counts rounds, not pauses, so the
    script's 3 steps are 3 (a quiet-time rule found 4: initialisation cut in two)."""
    mnt = _offload_dir(loop_device)
    cfg = json.loads((DATA / "opt_nvme.json").read_text())
    zo = cfg["zero_optimization"]
    zo["offload_optimizer"]["nvme_path"] = str(mnt / "swap")
    zo["sub_group_size"] = 1_000_000
    cfg["train_micro_batch_size_per_gpu"] = 2
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    model = str(DATA / "gpt_neox")
    p = iotune(
        "--json",
        "trace",
        *("--model", model, "--ds-config", str(tmp_path / "ds.json"), "--seq-len", "256"),
        *("--set", "accelerator=cpu", "--out", str(tmp_path / "t"), "--"),
        *(sys.executable, str(DATA / "train_script.py"), model, str(tmp_path / "ds.json")),
        *("3", "256", "1.0"),
        # DeepSpeed's ops as iotune built them (a script of its own would build them into
        # ~/.cache/torch_extensions first: minutes)
        env=worker_env(),
        check=False,
    )
    script_ended(p, 3)
    doc = json.loads(p.stdout)
    s = doc["script"]
    assert s["initialised"] and s["steps_found"] == 3, s
    assert s["late_cuts"] == 0 and not s["events_lost"], s
    assert [r["label"] for r in s["rows"]] == ["init:0", "step:1", "step:2", "step:3"]
    files = len(list((mnt / "swap" / "zero_stage_3" / "optimizer" / "rank0").glob("*.swp")))
    assert files % 3 == 0 and files >= 3 * 4, files  # a master and two moments a sub-group
    # the whole run's reads are the model's, but for the filesystem's own: the script makes
    # DeepSpeed's swap folder itself (ext4 read a 4 KiB metadata block at initialisation)
    assert 0 <= s["measured_total"]["read"] - s["predicted_total"]["read"] <= FS_WRITES
    assert 0 <= s["measured_total"]["write"] - s["predicted_total"]["write"] <= 4 * FS_WRITES
    # each interval is the model's: initialisation's two rounds together, the first step's
    # new moments within it; a step's reads fall on its side of the cut (DeepSpeed reads the
    # optimizer state only in the optimizer step, after the last write of the step before)
    for r in s["rows"]:
        assert r["measured"]["read"] == r["predicted"]["read"], r
        assert 0 <= r["measured"]["write"] - r["predicted"]["write"] <= 2 * FS_WRITES, r


@beside_study
@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("not json {", "is not JSON"),
        ("stage2_nvme", "on NVMe needs ZeRO stage 3"),
        ("no_nvme_path", "on nvme without an nvme_path"),
        ("rejected", "DeepSpeed rejects it"),
        ("small_buffers", "is smaller than the largest parameter"),
    ],
)
def test_bad_configs_get_one_line_and_a_hint(setup: str, message: str, tmp_path: Path) -> None:
    cfg: Any = json.loads((DATA / "params_opt_nvme.json").read_text())
    zo = cfg["zero_optimization"]
    if setup == "stage2_nvme":
        zo["stage"] = 2
        del zo["offload_param"]
    elif setup == "no_nvme_path":
        del zo["offload_optimizer"]["nvme_path"]
    elif setup == "rejected":
        zo["stage3_max_reuse_distance"] = "soon"
    elif setup == "small_buffers":
        zo["offload_param"]["buffer_size"] = 1000
    path = tmp_path / "ds.json"
    path.write_text(setup if setup.startswith("not json") else json.dumps(cfg))
    p = iotune(
        "estimate",
        *("--model", str(DATA / "qwen2_tied"), "--ds-config", str(path)),
        check=False,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 2 and message in lines[0] and lines[1].startswith("hint: "), p.stderr


@beside_study
def test_a_model_folder_without_config_json_gets_one_line(tmp_path: Path) -> None:
    p = iotune(
        "estimate",
        *("--model", str(tmp_path), "--ds-config", str(DATA / "opt_nvme.json")),
        check=False,
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 2 and "no config.json there" in lines[0], p.stderr


@beside_study
@pytest.mark.parametrize("model", ["mixtral", "phi3", "gpt_neox", "qwen2_tied"])
def test_every_weight_is_initialised_before_zero_init_partitions_it(model: str) -> None:
    """transformers leaves a Mixtral's experts and router as torch.empty until its
    _init_weights, which under zero.Init meets only empty partitions: trained as found, they
    gave NaN losses and skipped optimizer steps. Built in memory left full of NaN, every
    weight of two or more dimensions is normal(0, 0.02) and every other one finite and
    small (norms' ones, biases' zeros)."""
    p = subprocess.run(
        [sys.executable, str(DATA / "init_stats.py"), str(DATA / model)],
        capture_output=True,
        text=True,
        env={**worker_env(), "DS_ACCELERATOR": "cpu"},
        timeout=300,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert len(rows) > 10
    for r in rows:
        if r["dim"] >= 2:
            assert 0.015 < r["std"] < 0.025, r
        else:
            assert r["max"] <= 1.0, r


@beside_study
@pytest.mark.parametrize(
    ("command", "first", "second"),
    [
        (
            ["/nonexistent/train.py"],
            "iotune: error: no such program: /nonexistent/train.py",
            "hint: check the path",
        ),
        (
            ["iotune-no-such-launcher", "train.py"],
            "iotune: error: iotune-no-such-launcher is not installed (not found on PATH)",
            "hint: install it, or give its full path",
        ),
        (
            [sys.executable, "-c", "import sys; sys.exit(3)"],
            f"iotune: {Path(sys.executable).name} exited 3 before its first step",
            "hint: its own output is above",
        ),
    ],
)
def test_a_script_or_launcher_that_fails_is_named_with_its_exit_code(
    command: list[str], first: str, second: str, tmp_path: Path
) -> None:
    """A program that is not there, a launcher not installed, a launcher that fails before
    its first step: a line naming it (and its exit code), a hint, no traceback."""
    p = iotune(
        "trace",
        *("--model", str(DATA / "gpt_neox"), "--ds-config", str(DATA / "opt_nvme.json")),
        *("--set", "accelerator=cpu", "--target", str(tmp_path), "--out", str(tmp_path / "t")),
        "--",
        *command,
        check=False,
    )
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert any(x.startswith(first) for x in lines), p.stderr
    assert lines[-1].startswith(second), p.stderr
