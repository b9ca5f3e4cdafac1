"""Root tier: which parameters DeepSpeed keeps in CPU memory and which it reads back from the
drive, with the parameters on NVMe. A tiny GPT-NeoX (tests/data/custom/gpt_neox, float32:
its embedding, output layer and MLP matrices are the 1 MiB files) trains under the real
DeepSpeed ZeRO-3 on an ext4 loop device, traced by the real eBPF program, in two settings
that change what is kept:

* the Hugging Face Trainer's template (offload_param buffer_count 5, max_in_cpu left at
  DeepSpeed's 1e9 elements): deepspeed.initialize reads every parameter file once into
  pinned CPU memory, and the steps move the optimizer state's bytes only;
* max_in_cpu that holds only the first optimizer sub-group (the embedding), a persistence
  threshold above the MLP matrices, accumulation 2: the other files are read back at every
  forward, the persistent ones once a step, and every file on the drive written back.

Every initialisation and steady step reads the estimate's bytes to the byte and writes them
up to the filesystem's own (iotune/model/swapfiles.py parameter_placement)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.io_rules import PAGES, param_reads_shift_ok
from tests.root.conftest import iotune_json

DATA = Path(__file__).resolve().parent.parent / "data" / "custom"
#: what writes move beyond DeepSpeed's files: ext4's journal and metadata
FS_WRITES = 256 * 1024
#: the model's swappable float32 tensors: the embedding, the output layer (4096 x 256) and
#: each of the two layers' MLP matrices (256 x 1024); its attention's are under 1 MiB
EMBEDDING = 4096 * 256
MLP = 256 * 1024
FILES = 2 * EMBEDDING + 2 * 2 * MLP

pytestmark = pytest.mark.beside_study


def _config(tmp: Path, name: str, zero: dict[str, Any], param: dict[str, Any], ga: int) -> Path:
    cfg: dict[str, Any] = json.loads((DATA / "params_opt_nvme.json").read_text())
    cfg["gradient_accumulation_steps"] = ga
    cfg["zero_optimization"].update(zero)
    op = cfg["zero_optimization"]["offload_param"]
    op.update(param)
    for k in [k for k, v in op.items() if v is None]:
        del op[k]  # DeepSpeed's default
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg, indent=2))
    return path


def _trace(loop_device: Callable[..., str], cfg: Path, out: Path) -> dict[str, Any]:
    dev = loop_device(size_mib=1024, fs="ext4", mount=True)
    # DeepSpeed's 512 KiB requests whole, as on an NVMe drive (a loop device merges two)
    Path(f"/sys/block/{Path(dev).name}/queue/max_sectors_kb").write_text("512")
    mnt = loop_device.mounts[-1]  # type: ignore[attr-defined]
    doc: dict[str, Any] = iotune_json(
        "trace",
        *("--model", str(DATA / "gpt_neox"), "--ds-config", str(cfg)),
        *("--set", "accelerator=cpu", "--seq-len", "32", "--steps", "3"),
        *("--nvme-path", str(mnt), "--out", str(out)),
    )
    assert doc["exit_code"] == 0 and doc["steps_done"] == 3, doc.get("error")
    losses = [e["loss"] for e in doc["events"] if e.get("event") == "step"]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses), losses
    assert [s["label"] for s in doc["io_steps"]] == ["init:0", "step:1", "step:2", "step:3"]
    files = int(max(e["swap"]["apparent"] for e in doc["events"] if e.get("swap")))
    assert files == doc["estimate"]["nvme_bytes"]  # every parameter file stays, used or not
    return doc


def _writes_ok(measured: int, predicted: int) -> bool:
    return 0 <= measured - predicted <= FS_WRITES


def test_the_trainer_template_keeps_the_model_in_cpu_memory(
    loop_device: Callable[..., str], tmp_path: Path
) -> None:
    cfg = _config(
        tmp_path,
        "template",
        # the values the Trainer fills for hidden 256 (transformers.integrations.deepspeed)
        {
            "stage3_prefetch_bucket_size": 58982,
            "stage3_param_persistence_threshold": 2560,
            "stage3_max_live_parameters": 1_000_000_000,
            "stage3_max_reuse_distance": 1_000_000_000,
        },
        {"buffer_count": 5, "max_in_cpu": None},
        ga=2,
    )
    doc = _trace(loop_device, cfg, tmp_path / "r")
    est = doc["estimate"]
    sw = est["swapped"]
    assert (sw["n_p"], sw["n_r"], sw["n_k"]) == (FILES, 0, 0)
    optimizer = 12 * sw["n_s"] + 4 * sw["n_g"]
    assert est["steady_step"] == {"read": optimizer, "write": optimizer}
    init, *steps = doc["io_steps"]
    # zero.Init writes each file, deepspeed.initialize reads each once: exact
    assert init["read"]["bytes"] == est["init"]["read"]
    assert _writes_ok(init["write"]["bytes"], est["init"]["write"])
    for s, want in zip(
        steps, (est["first_step"], est["steady_step"], est["steady_step"]), strict=True
    ):
        # no parameter read back, no parameter written: the optimizer state's bytes alone
        assert s["read"]["bytes"] == want["read"], s["label"]
        assert _writes_ok(s["write"]["bytes"], want["write"]), s["label"]


def test_max_in_cpu_and_persistence_decide_what_is_read_back(
    loop_device: Callable[..., str], tmp_path: Path
) -> None:
    cfg = _config(
        tmp_path,
        "part",
        # sub-groups of 1e6 elements or just over: the embedding alone, then a layer and a
        # half, then the rest with the output layer
        {"sub_group_size": 1_000_000, "stage3_param_persistence_threshold": 300_000},
        {"max_in_cpu": 1_100_000},
        ga=2,
    )
    doc = _trace(loop_device, cfg, tmp_path / "r")
    est = doc["estimate"]
    sw = est["swapped"]
    # on the drive: the layers' MLP matrices (persistent) and the output layer
    assert (sw["n_p"], sw["n_r"], sw["n_k"]) == (FILES, EMBEDDING + 4 * MLP, 4 * MLP)
    optimizer = 12 * sw["n_s"] + 4 * sw["n_g"]
    # each micro-step's forward reads the output layer (DeepSpeed keeps it to backward at
    # the default reuse distance); the persistent matrices are read once, after the step;
    # every file on the drive is written back
    assert est["steady_step"] == {
        "read": optimizer + 4 * (2 * EMBEDDING + 4 * MLP),
        "write": optimizer + 4 * (EMBEDDING + 4 * MLP),
    }
    init, first, *steady = doc["io_steps"]
    # the embedding read once into CPU memory, the others twice, and written back
    assert est["init"]["read"] - 4 * sw["n_s"] == 4 * (EMBEDDING + 2 * sw["n_r"])
    assert init["read"]["bytes"] == est["init"]["read"]
    assert _writes_ok(init["write"]["bytes"], est["init"]["write"])
    for s in steady:
        assert s["read"]["bytes"] == est["steady_step"]["read"], s["label"]
        assert _writes_ok(s["write"]["bytes"], est["steady_step"]["write"]), s["label"]
    # the first step records DeepSpeed's trace: reads give or take whole files
    assert _writes_ok(first["write"]["bytes"], est["first_step"]["write"])
    off = first["read"]["bytes"] - est["first_step"]["read"]
    assert param_reads_shift_ok(off, sw["n_p"], PAGES), off
