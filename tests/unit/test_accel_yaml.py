"""accelerate's YAML config as --ds-config (iotune.model.accel, iotune.workers.accel_config):
the forms accelerate's DeepSpeed guide shows ("DeepSpeed Plugin" examples with
deepspeed_config: zero_stage, offload_*_device, gradient_accumulation_steps, ...; and one
naming a deepspeed_config_file), read by accelerate's own loader, launcher and
DeepSpeedPlugin into the config accelerate launch gives DeepSpeed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from iotune import cli as cli_mod
from iotune.model.custom import custom_preset
from iotune.model.presets import Preset

DATA = Path(__file__).resolve().parent.parent / "data" / "custom"

#: the workers these tests start (transformers' and accelerate's own readers of a config)
#: fork from the session's zygote (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("zygote_workers")

#: accelerate's guide, "ZeRO Stage-3 with CPU Offload DeepSpeed Plugin Example", with the
#: optimizer state on NVMe and bf16 (iotune does not model fp16)
PLUGIN = """\
compute_environment: LOCAL_MACHINE
deepspeed_config:
  gradient_accumulation_steps: 1
  gradient_clipping: 1.0
  offload_optimizer_device: nvme
  offload_optimizer_nvme_path: /mnt/nvme
  offload_param_device: cpu
  zero3_init_flag: true
  zero3_save_16bit_model: true
  zero_stage: 3
distributed_type: DEEPSPEED
fsdp_config: {}
machine_rank: 0
main_process_ip: null
main_process_port: null
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 2
use_cpu: false
"""

#: the guide's form that names a DeepSpeed config file
CONFIG_FILE = """\
compute_environment: LOCAL_MACHINE
deepspeed_config:
  deepspeed_config_file: {json}
  zero3_init_flag: true
distributed_type: DEEPSPEED
fsdp_config: {{}}
machine_rank: 0
main_process_ip: null
main_process_port: null
main_training_function: main
mixed_precision: null
num_machines: 1
num_processes: 2
use_cpu: false
"""


def _estimate(yaml: str, tmp_path: Path, *args: str) -> Result:
    path = tmp_path / "acc.yaml"
    path.write_text(yaml)
    model = ("--model", str(DATA / "gpt_neox"), "--ds-config", str(path), "--seq-len", "256")
    return CliRunner().invoke(cli_mod.cli, ["estimate", *model, *args], prog_name="iotune")


def _preset(
    yaml: str, tmp_path: Path, micro_batch: int | None = None, ga: int | None = None
) -> Preset:
    path = tmp_path / "acc.yaml"
    path.write_text(yaml)
    return custom_preset(
        str(DATA / "gpt_neox"), str(path), seq_len=256, micro_batch=micro_batch, ga=ga
    )


def test_the_plugin_form_is_the_config_accelerate_launch_gives_deepspeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stage, offload devices, accumulation, clipping, bf16 from mixed_precision and the two
    processes as ranks; the micro-batch from --micro-batch (the DataLoader's). The swap
    folder the YAML names is not what accelerate launch hands DeepSpeed: the advice says so
    and names the variable that carries it."""
    monkeypatch.delenv("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", raising=False)
    p = _preset(PLUGIN, tmp_path, micro_batch=2)
    cfg = p.deepspeed
    zo = cfg["zero_optimization"]
    assert zo["stage"] == 3 and zo["offload_optimizer"]["device"] == "nvme"
    assert zo["offload_param"]["device"] == "cpu"
    assert zo["stage3_gather_16bit_weights_on_model_save"] is True
    assert cfg["bf16"]["enabled"] is True and cfg["fp16"]["enabled"] is False
    assert cfg["gradient_clipping"] == 1.0 and cfg["gradient_accumulation_steps"] == 1
    assert (p.ranks, p.dtype, p.micro_batch, p.ga) == (2, "bf16", 2, 1)
    filled = {k: (json.loads(v), why) for k, v, why in p.ds_filled}
    assert filled["train_micro_batch_size_per_gpu"][0] == 2
    assert filled["train_batch_size"][0] == 2 * 1 * 2
    assert zo["offload_optimizer"]["nvme_path"] == "none"
    notes = dict(p.ds_notes)
    text = notes["zero_optimization.offload_optimizer.nvme_path"]
    assert "deepspeed_config.offload_optimizer_nvme_path is /mnt/nvme" in text
    assert "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH=/mnt/nvme" in text
    # where the variable is set, the folder reaches DeepSpeed
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", "/mnt/nvme")
    p = _preset(PLUGIN, tmp_path, micro_batch=2)
    assert p.deepspeed["zero_optimization"]["offload_optimizer"]["nvme_path"] == "/mnt/nvme"
    assert not any("nvme_path" in k for k, _ in p.ds_notes)


def test_a_yaml_naming_a_deepspeed_config_file_is_that_file_as_accelerate_fills_it(
    tmp_path: Path,
) -> None:
    cfg = json.loads((DATA / "opt_nvme.json").read_text())
    cfg["gradient_accumulation_steps"] = "auto"
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    p = _preset(CONFIG_FILE.format(json=tmp_path / "ds.json"), tmp_path, ga=4)
    got = p.deepspeed
    assert got["zero_optimization"] == cfg["zero_optimization"]
    assert got["aio"] == cfg["aio"] and got["train_micro_batch_size_per_gpu"] == 1
    filled = {k: (json.loads(v), why) for k, v, why in p.ds_filled}
    assert filled["gradient_accumulation_steps"][0] == 4
    assert "Accelerator(gradient_accumulation_steps=)" in filled["gradient_accumulation_steps"][1]
    assert (p.ga, p.ranks, p.dtype) == (4, 2, "fp32")


def test_the_yaml_is_said_to_be_accelerates_and_its_values_where_they_come_from(
    tmp_path: Path,
) -> None:
    r = _estimate(PLUGIN, tmp_path, "--micro-batch", "2")
    assert r.exit_code == 0, r.output
    assert "accelerate's config" in r.stdout
    assert "filled as accelerate's prepare() fills them" in r.stdout
    assert "--micro-batch (your DataLoader's)" in r.stdout


@pytest.mark.parametrize(
    ("change", "args", "line", "hint"),
    [
        # the guide's own example trains in fp16, which iotune does not model
        (
            ("mixed_precision: bf16", "mixed_precision: fp16"),
            ("--micro-batch", "2"),
            "fp16 training is not modelled",
            "bf16",
        ),
        # the micro-batch is the DataLoader's: iotune cannot see it
        (("", ""), (), 'train_micro_batch_size_per_gpu is "auto"', "--micro-batch"),
        # no DeepSpeed in it
        (
            ("distributed_type: DEEPSPEED", "distributed_type: MULTI_GPU"),
            (),
            "distributed_type is MULTI_GPU",
            "DEEPSPEED",
        ),
        # a key accelerate does not know: its loader refuses it, and so does iotune
        (
            ("use_cpu: false", "use_cpu: false\nzero_stage: 3"),
            (),
            "accelerate cannot read it",
            "accelerate config",
        ),
    ],
)
def test_a_yaml_accelerate_or_iotune_would_refuse_is_one_line_and_a_hint(
    change: tuple[str, str], args: tuple[str, ...], line: str, hint: str, tmp_path: Path
) -> None:
    r = _estimate(PLUGIN.replace(*change), tmp_path, *args)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 2, r.stderr
    assert line in lines[0] and hint in lines[1], r.stderr


def test_a_file_neither_json_nor_accelerates_yaml_is_still_not_json(tmp_path: Path) -> None:
    r = _estimate("train_batch_size: 8\n", tmp_path)
    assert r.exit_code == 2, r.output
    assert "acc.yaml is not JSON: Expecting value at line 1 column 1" in r.stderr
    assert "or accelerate's YAML config" in r.stderr
