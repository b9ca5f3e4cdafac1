"""What a traced run tells iotune itself (iotune/hook/sitecustomize.py, iotune.train.observe):
the hook in a real Python process beside a stand-in DeepSpeed package (the real one trains in
the root tier, tests/root/test_launchers_root.py), the reports read as they come, and the
line naming a figure the run used otherwise than iotune was told."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from iotune.model.dsconfig import ds_config
from iotune.model.estimate import Estimate, estimate
from iotune.model.presets import Preset
from iotune.train.observe import (
    HOOK_ENV,
    Observer,
    SwapSite,
    differences,
    disagreement,
    hook_env,
    learned_estimate,
    read_learned,
    swap_site,
)
from tests.unit.test_custom import _preset

#: a stand-in for DeepSpeed's engine module: the attributes the hook reads, nothing more
FAKE_ENGINE = """
class _Off:
    def __init__(self, device, path):
        self.device, self.nvme_path = device, path

class _Zero:
    stage = 3
    offload_optimizer = _Off("nvme", "rel/swap")
    offload_param = _Off("none", None)

class _Config:
    zero_config = _Zero()
    _param_dict = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 4,
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": "rel/swap"},
        },
    }

class _Param:  # a ZeRO-3 partition: numel() is this rank's share, ds_numel the tensor's
    def __init__(self, n, shape):
        self.ds_numel, self.ds_shape, self.requires_grad = n, shape, True
    def numel(self):
        return 0

class Model:
    emb = _Param(4096 * 256, (4096, 256))
    def named_parameters(self, remove_duplicate=True):
        own = [("embed.weight", self.emb), ("h.0.weight", _Param(256 * 768, (256, 768)))]
        return own + ([("lm_head.weight", self.emb)] if not remove_duplicate else [])

class DeepSpeedEngine:
    world_size, global_rank = 1, 0
    def __init__(self, model):
        self._config = _Config()
        self._configure_distributed_model(model)
    def _configure_distributed_model(self, model):
        self.module = model
    def train_micro_batch_size_per_gpu(self):
        return 2
    def gradient_accumulation_steps(self):
        return 4
    def train_batch_size(self):
        return 8
    def bfloat16_enabled(self):
        return True
    def fp16_enabled(self):
        return False
"""


def _fake_deepspeed(root: Path, engine: str = FAKE_ENGINE) -> Path:
    pkg = root / "fake" / "deepspeed"
    (pkg / "runtime").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "0-stand-in"\n')
    (pkg / "runtime" / "__init__.py").write_text("")
    (pkg / "runtime" / "engine.py").write_text(engine)
    return root / "fake"


def _python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=cwd,
        timeout=60,
        check=False,
    )


def _env(learn: Path, *more: Path) -> dict[str, str]:
    return hook_env(learn, {"PYTHONPATH": os.pathsep.join(map(str, more))} if more else {})


TRAIN = """
import deepspeed.runtime.engine as e
engine = e.DeepSpeedEngine(e.Model())
print("trained", type(engine.module).__name__)
"""


def test_the_hook_stays_out_of_a_program_that_never_imports_deepspeed(tmp_path: Path) -> None:
    learn = tmp_path / "learn"
    learn.mkdir()
    p = _python(
        "import sys; print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))",
        _env(learn),
        tmp_path,
    )
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stderr
    assert not list(learn.iterdir())


def test_an_engine_reports_itself_and_waits_until_the_swap_folder_is_watched(
    tmp_path: Path,
) -> None:
    """The report is read as it comes: the step watch is put where the run's swap files go
    (a relative nvme_path is the process's working folder's), before the process goes on."""
    learn = tmp_path / "learn"
    fake = _fake_deepspeed(tmp_path)
    with Observer(learn, tmp_path / "events.jsonl") as obs:
        p = _python(TRAIN, _env(learn, fake), tmp_path)
        assert obs.site == SwapSite(tmp_path / "rel" / "swap", True, 1)
    assert p.returncode == 0 and "trained Model" in p.stdout, p.stderr
    assert (learn / "engine-rank0.go").exists()
    assert (tmp_path / "rel/swap/zero_stage_3/optimizer/rank0").is_dir()
    learned, errors = read_learned(learn)
    assert learned is not None and not errors
    d = learned.doc
    assert (d["micro_batch"], d["ga"], d["train_batch_size"], d["dtype"]) == (2, 4, 8, "bf16")
    assert d["optimizer_nvme_path"] == "rel/swap" and d["cwd"] == str(tmp_path)
    # the tensors' whole sizes (ds_numel), not the rank's partitions; the tied one apart
    assert d["model"]["tensors"] == [
        ["embed.weight", 4096 * 256, [4096, 256]],
        ["h.0.weight", 256 * 768, [256, 768]],
    ]
    assert d["model"]["tied"] == [["lm_head.weight", 4096 * 256]]
    preset, est = learned_estimate(learned)
    assert est.params == 4096 * 256 + 256 * 768
    assert (preset.micro_batch, preset.ga, preset.dtype, preset.ranks) == (2, 4, "bf16", 1)
    written = json.loads((learn / "ds_config.json").read_text())
    assert written["zero_optimization"]["offload_optimizer"]["nvme_path"] == str(
        tmp_path / "rel" / "swap"
    )


#: a stand-in for zero.Init with its parameters on NVMe: the swapper DeepSpeed makes there
FAKE_ZERO_INIT = """
class _Swap:
    class swap_config:
        nvme_path = "params-here"

class Init:
    def __init__(self, module=None, data_parallel_group=None, mem_efficient_linear=True,
                 remote_device=None, pin_memory=False, config_dict_or_path=None):
        self.param_swapper = _Swap()
"""


def test_zero_init_with_parameters_on_nvme_reports_before_its_first_parameter_file(
    tmp_path: Path,
) -> None:
    """zero.Init writes each parameter's file as the model is built, before any engine: with
    the optimizer state in RAM, those are the files a step rewrites, watched from here."""
    learn = tmp_path / "learn"
    fake = _fake_deepspeed(tmp_path)
    zero = fake / "deepspeed" / "runtime" / "zero"
    zero.mkdir()
    (zero / "__init__.py").write_text("")
    (zero / "partition_parameters.py").write_text(FAKE_ZERO_INIT)
    cfg = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    code = f"""
    from deepspeed.runtime.zero.partition_parameters import Init
    Init(config_dict_or_path={cfg!r})
    print("built")
    """
    with Observer(learn, tmp_path / "events.jsonl") as obs:
        p = _python(code, _env(learn, fake), tmp_path)
        assert obs.site == SwapSite(tmp_path / "params-here", False, 1)
    assert p.returncode == 0 and p.stdout.strip() == "built", p.stderr
    assert (learn / "init-rank0.go").exists()
    doc = json.loads((learn / "init-rank0.json").read_text())
    assert (doc["source"], doc["offload_optimizer"]) == ("zero.Init", "cpu")


def test_a_failure_inside_the_hook_never_breaks_the_program(tmp_path: Path) -> None:
    """An engine the hook cannot read (another DeepSpeed): the program runs as without it,
    and the hook's one line is there for iotune's note."""
    learn = tmp_path / "learn"
    learn.mkdir()
    broken = FAKE_ENGINE.replace("zero_config = _Zero()", "")
    fake = _fake_deepspeed(tmp_path, broken)
    p = _python(TRAIN, _env(learn, fake), tmp_path)
    assert p.returncode == 0 and "trained Model" in p.stdout, p.stderr
    learned, errors = read_learned(learn)
    assert learned is None
    assert errors == [
        "DeepSpeedEngine._configure_distributed_model: AttributeError: '_Config' object has "
        "no attribute 'zero_config'"
    ]


def test_the_sitecustomize_the_hook_hides_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("print('their sitecustomize ran')\n")
    learn = tmp_path / "learn"
    learn.mkdir()
    p = _python("print('main')", _env(learn, theirs), tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["their sitecustomize ran", "main"]


def test_the_hook_is_first_on_the_path_and_the_users_entries_follow(tmp_path: Path) -> None:
    env = hook_env(tmp_path / "learn", {"PYTHONPATH": "/a:/b"})
    first, *rest = env["PYTHONPATH"].split(os.pathsep)
    assert (Path(first) / "sitecustomize.py").is_file() and rest == ["/a", "/b"]
    assert env[HOOK_ENV] == str(tmp_path / "learn")


@pytest.mark.parametrize(
    ("doc", "site"),
    [
        (
            {"offload_optimizer": "nvme", "optimizer_nvme_path": "none", "cwd": "/w"},
            SwapSite(Path("/w/none"), True, 1),
        ),
        (
            {
                "offload_optimizer": "nvme",
                "optimizer_nvme_path": "/nv",
                "zero_stage": 3,
                "local_world_size": 2,
                "world_size": 4,
            },
            SwapSite(Path("/nv"), True, 2),
        ),
        # stages 1 and 2 keep an "nvme" optimizer state in RAM: the parameters, or nothing
        ({"offload_optimizer": "nvme", "optimizer_nvme_path": "/nv", "zero_stage": 2}, None),
        (
            {"offload_optimizer": "cpu", "offload_param": "nvme", "param_nvme_path": "/p"},
            SwapSite(Path("/p"), False, 1),
        ),
    ],
)
def test_the_swap_folder_a_report_names(doc: dict[str, object], site: SwapSite | None) -> None:
    assert swap_site(doc) == site


def _told_and_run(
    micro_batch: int = 1, ga: int = 1, ranks: int = 1
) -> tuple[Preset, Estimate, Preset, Estimate]:
    cfg = {
        "zero_optimization": {
            "stage": 3,
            "sub_group_size": 1e9,
            "offload_optimizer": {"device": "nvme", "nvme_path": "/nv/"},
        }
    }
    told = _preset(cfg)
    run_cfg = json.loads(json.dumps(cfg))
    run_cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] = "/nv"
    run_cfg["zero_optimization"]["sub_group_size"] = 1_000_000_000
    run = replace(_preset(run_cfg), micro_batch=micro_batch, ga=ga, ranks=ranks)
    return told, estimate(told, ds_config(told)), run, estimate(run, ds_config(run))


def test_a_run_that_used_what_iotune_was_told_says_nothing() -> None:
    """1e9 and 1,000,000,000 are one sub-group size, /nv/ and /nv one folder."""
    assert differences(*_told_and_run()) == []
    assert disagreement([]) is None


def test_every_figure_the_run_used_otherwise_is_named_in_one_line() -> None:
    diffs = differences(*_told_and_run(micro_batch=2, ga=4, ranks=2))
    assert disagreement(diffs) == (
        "the run's own figures differ from what iotune was told: world size 2 (told 1), "
        "micro-batch 2 (told 1), gradient accumulation 4 (told 1); the estimate beside the "
        "steps is the run's"
    )
    told, told_est, run, _ = _told_and_run()
    cfg = json.loads(json.dumps(run.deepspeed))
    cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] = "none"
    cfg["aio"] = {"block_size": 524288}
    run = replace(run, deepspeed=cfg)
    line = disagreement(differences(told, told_est, run, estimate(run, ds_config(run))))
    assert line is not None and "\n" not in line
    assert "zero_optimization.offload_optimizer.nvme_path none (told /nv/)" in line
    assert "aio.block_size 524,288 (told 1,048,576)" in line
