"""Your model and DeepSpeed config (iotune.model.custom and dsfile, advice, swapwatch): the
pure parts. The model's tensors come from transformers in the root tier
(tests/root/test_custom_root.py); here a geometry is written by hand."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from iotune.errors import UsageError
from iotune.model.custom import pick_preset, strategy_of
from iotune.model.dsconfig import ds_config
from iotune.model.dsfile import read_ds_config
from iotune.model.estimate import estimate
from iotune.model.geometry import ModelGeometry
from iotune.model.presets import Preset, PresetError, apply_sets
from iotune.plan.advice import advise
from iotune.train.swapwatch import StepWatch, state_files

DATA = Path(__file__).resolve().parent.parent / "data" / "custom"
MIB = 1 << 20

#: the workers these tests start (transformers' and accelerate's own readers of a config)
#: fork from the session's zygote (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("zygote_workers")


def _geometry(tied: bool) -> ModelGeometry:
    emb = ("transformer.wte.weight", 4096 * 256)
    layer = [(f"h.{i}.attn.c_attn.weight", 256 * 768) for i in range(2)]
    return ModelGeometry(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=4,
        tie_word_embeddings=tied,
        vocab_size=4096,
        source="hand-made",
        architecture="GPT2LMHeadModel",
        type_name="gpt2",
        params=(emb, *layer),
        tied=(("lm_head.weight", 4096 * 256),) if tied else (),
    )


def _preset(cfg: dict, tied: bool = False) -> Preset:  # type: ignore[type-arg]
    return Preset(
        name="mine+ds",
        size="custom",
        geometry=_geometry(tied),
        strategy=strategy_of(cfg, "ds.json"),
        ga=1,
        micro_batch=1,
        seq_len=16,
        steps=3,
        accelerator="cpu",
        nvme_path="/var/tmp/x",
        deepspeed=cfg,
        dtype="fp32",
        ds_user=True,
    )


def _cfg(name: str) -> dict:  # type: ignore[type-arg]
    return dict(json.loads((DATA / name).read_text()))


def test_the_estimate_counts_the_models_own_tensors_and_its_tied_orphan() -> None:
    p = _preset(_cfg("params_opt_nvme.json"), tied=True)
    cfg = ds_config(p, "/mnt/x/swap")
    # the user's config, run as it is, with the run's own swap folder
    assert cfg["zero_optimization"]["offload_param"]["buffer_count"] == 24
    assert cfg["zero_optimization"]["offload_optimizer"]["nvme_path"] == "/mnt/x/swap"
    assert cfg["bf16"]["enabled"] is False
    e = estimate(p, cfg)
    n = 4096 * 256 + 2 * 256 * 768
    assert e.params == n and e.swapped.n_s == n
    # fp32 parameter files of at least 1 MiB: the embedding only (the layers' are 768 KiB)
    assert e.swapped.n_p == 4096 * 256
    orphan = 4 * 4096 * 256
    assert e.nvme_bytes == 12 * n + 4 * e.swapped.n_g + 4 * e.swapped.n_p + orphan
    untied = estimate(_preset(_cfg("params_opt_nvme.json")), cfg)
    assert e.nvme_bytes - untied.nvme_bytes == orphan


def test_the_strategy_is_where_the_config_puts_the_state() -> None:
    s = strategy_of(_cfg("opt_nvme.json"), "a.json")
    assert (s.stage, s.optimizer, s.params, s.zenflow) == (3, "nvme", "gpu", False)
    s = strategy_of(_cfg("params_opt_nvme.json"), "a.json")
    assert (s.optimizer, s.params) == ("nvme", "nvme")
    assert strategy_of({}, "a.json").optimizer == "gpu"


def test_model_fields_cannot_be_set_on_your_model() -> None:
    with pytest.raises(PresetError, match="the model is hand-made"):
        apply_sets(_preset(_cfg("opt_nvme.json")), {"model.num_hidden_layers": 4})


def test_preset_or_model_and_config_never_both_nor_half(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not both"):
        pick_preset("tiny_opt_nvme", "m", "c.json")
    with pytest.raises(UsageError, match="--ds-config is missing"):
        pick_preset(None, "m", None)
    with pytest.raises(UsageError, match="--model is missing"):
        pick_preset(None, None, "c.json")
    with pytest.raises(UsageError, match="name a preset"):
        pick_preset(None)
    assert pick_preset("tiny_opt_nvme", seq_len=7).seq_len == 7


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is not JSON: Expecting property name"),
        ("[1]", "is not a JSON object"),
        ('{"fp16": {"enabled": true}}', "fp16 training is not modelled"),
        (
            '{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}',
            "offload_param is on nvme without an nvme_path",
        ),
    ],
)
def test_a_config_is_refused_before_deepspeed_is_asked(
    text: str, message: str, tmp_path: Path
) -> None:
    (tmp_path / "ds.json").write_text(text)
    with pytest.raises(PresetError, match=message) as info:
        read_ds_config(str(tmp_path / "ds.json"))
    assert info.value.hint


def test_advice_on_a_sub_group_that_pins_the_whole_model() -> None:
    cfg = _cfg("opt_nvme.json")
    big = _preset(cfg)
    g = big.geometry
    assert isinstance(g, ModelGeometry)
    many = ModelGeometry(
        **{**g.__dict__, "params": tuple((f"p{i}", 50_000_000) for i in range(40))}
    )
    from dataclasses import replace

    p = replace(big, geometry=many, nvme_path=None)
    cfg["zero_optimization"]["sub_group_size"] = 1_000_000_000
    e = estimate(p, ds_config(p))
    (a,) = advise(p, ds_config(p), e)
    assert a.setting == "zero_optimization.sub_group_size" and a.saves_bytes
    assert a.saves_bytes == e.host.swap_buffers - 4 * 4 * 100_000_000  # type: ignore[union-attr]
    cfg["zero_optimization"]["sub_group_size"] = 100_000_000
    p = replace(p, deepspeed=cfg)
    assert advise(p, ds_config(p), estimate(p, ds_config(p))) == []


def _events(path: Path) -> list[tuple[str, int]]:
    return [(e["event"], e["step"]) for e in map(json.loads, path.read_text().splitlines())]


def test_the_step_watch_counts_rounds_of_writes_not_pauses(tmp_path: Path) -> None:
    """Initialisation writes each sub-group's fp32 file twice (with a pause between the two
    rounds longer than any quiet moment); the first step rewrites it and creates the two
    moments' files in a second batch; later steps rewrite all three. Gradient files do not
    count, and no cut depends on how long anything took."""
    nvme = tmp_path / "swap"
    events = tmp_path / "events.jsonl"
    rank = nvme / "zero_stage_3" / "optimizer" / "rank0"

    def write(*names: str) -> None:
        for n in names:
            (rank / n).write_bytes(b"x")

    with StepWatch(nvme, events) as watch:
        assert rank.is_dir()  # made and watched before DeepSpeed's first write
        write("1.tensor.swp", "2.tensor.swp")  # zero.Init's fp32 masters
        time.sleep(0.5)  # a long pause inside initialisation
        write("1.tensor.swp", "2.tensor.swp")  # initialize_optimizer_states
        write("9_gradient_0_10.tensor.swp")  # backward
        write("1.tensor.swp", "3.tensor.swp", "4.tensor.swp")  # step 1, sub-group 1
        write("2.tensor.swp")  # sub-group 2's master: its moments not there yet
        watch.flush()
        assert _events(events) == [("init", 0)]
        write("5.tensor.swp", "6.tensor.swp")  # ... and now they are: step 1 ends
        write("9_gradient_0_10.tensor.swp")
        write("1.tensor.swp", "3.tensor.swp", "4.tensor.swp")  # step 2 half done: no cut
        watch.flush()
        got = _events(events)
        write("2.tensor.swp", "5.tensor.swp", "6.tensor.swp")
    assert got == [("init", 0), ("step", 1)]
    assert _events(events) == [("init", 0), ("step", 1), ("step", 2)]
    assert watch.late_cuts == 0 and not watch.overflowed
    assert set(state_files(nvme)) == {str(rank / f"{i}.tensor.swp") for i in range(1, 7)}
    os.remove(rank / "1.tensor.swp")
    assert len(state_files(nvme)) == 5


def test_the_step_watch_counts_writes_of_one_file_it_has_not_read_yet(tmp_path: Path) -> None:
    """One sub-group: initialisation writes its one file twice in a row. With the watch's
    thread held off (a busy host), both writes are queued unread; the kernel merges
    identical unread events, so the opens between the closes keep the two writes two."""
    nvme = tmp_path / "swap"
    rank = nvme / "zero_stage_3" / "optimizer" / "rank0"
    events = tmp_path / "events.jsonl"
    with StepWatch(nvme, events) as watch:
        with watch._lock:  # the thread cannot read meanwhile
            for _ in range(2):
                (rank / "1.tensor.swp").write_bytes(b"x")
        watch.flush()
        assert _events(events) == [("init", 0)]


def test_the_step_watch_ignores_an_earlier_runs_files_and_waits_for_every_rank(
    tmp_path: Path,
) -> None:
    """A swap folder an earlier run left (its files rewritten in place, one it never
    touches again) and two ranks: a round ends when both ranks have written every file."""
    nvme = tmp_path
    r0 = nvme / "zero_stage_3" / "optimizer" / "rank0"
    r1 = nvme / "zero_stage_3" / "optimizer" / "rank1"
    r0.mkdir(parents=True)
    for n in ("1.tensor.swp", "7.tensor.swp", "8.tensor.swp", "99.tensor.swp"):
        (r0 / n).write_bytes(b"old")
    events = tmp_path / "events.jsonl"

    def write(d: Path, *names: str) -> None:
        for n in names:
            (d / n).write_bytes(b"x")

    with StepWatch(nvme, events, ranks=2) as watch:
        for _ in range(2):  # initialisation's two rounds
            write(r0, "1.tensor.swp")
            write(r1, "2.tensor.swp")
        write(r0, "1.tensor.swp", "7.tensor.swp", "8.tensor.swp")  # rank 0's first step
        watch.flush()
        assert _events(events) == [("init", 0)]  # rank 1 is still in its step
        write(r1, "2.tensor.swp", "3.tensor.swp", "4.tensor.swp")
    assert _events(events) == [("init", 0), ("step", 1)]


def test_the_step_watch_on_parameter_files_alone(tmp_path: Path) -> None:
    """Parameters on NVMe without the optimizer state: the parameter files' rounds, one a
    step; reading them (forward, backward) does not count."""
    d = tmp_path / "zero_stage_3" / "bfloat16params" / "rank0"
    events = tmp_path / "events.jsonl"
    d.mkdir(parents=True)
    with StepWatch(tmp_path, events, optimizer=False) as watch:
        for _ in range(4):
            for n in ("1_param.tensor.swp", "2_param.tensor.swp"):
                (d / n).write_bytes(b"x")
            (d / "1_param.tensor.swp").read_bytes()
    assert _events(events) == [("init", 0), ("step", 1), ("step", 2)]
    assert watch.late_cuts == 0


def test_advice_on_an_aio_block_the_sweep_measured_slower(tmp_path: Path) -> None:
    """--aio-config SWEEP_RUN: your config's block beside the sweep's best, from its points."""
    from iotune.plan.advice import _swept_block

    def point(op: str, bs: int, qd: int, gib_s: float, status: str = "ok") -> str:
        return json.dumps(
            {
                "op": op,
                "status": status,
                "block_size": bs,
                "queue_depth": qd,
                "threads": 1,
                "single_submit": False,
                "overlap_events": True,
                "bw_bytes_s": gib_s * 2**30,
            }
        )

    (tmp_path / "points.jsonl").write_text(
        "\n".join(
            [
                point("read", MIB // 2, 8, 1.5),
                point("write", MIB // 2, 8, 2.8),
                point("read", MIB, 32, 2.0),
                point("write", MIB, 32, 3.2),
                # a point marked failed (its file still in the page cache): never the best
                point("read", MIB, 64, 40.0, "failed"),
                point("write", MIB, 64, 40.0, "failed"),
            ]
        )
        + "\n"
    )
    mine = {
        "block_size": MIB // 2,
        "queue_depth": 8,
        "intra_op_parallelism": 1,
        "single_submit": False,
        "overlap_events": True,
    }
    (a,) = _swept_block(mine, tmp_path)
    assert "25% and 13% below its best" in a.text and "block 1M, queue depth 32" in a.text
    assert _swept_block({**mine, "block_size": MIB, "queue_depth": 32}, tmp_path) == []
    assert _swept_block({**mine, "queue_depth": 64}, tmp_path) == []  # not swept: no figure


@pytest.mark.parametrize(
    ("count", "reuse", "need"),
    [(2, None, 3), (3, None, None), (1, 0, 2), (2, 0, None)],
)
def test_advice_on_too_few_parameter_swap_buffers(
    count: int, reuse: int | None, need: int | None
) -> None:
    """Three swapped parameters (the embedding and two 196,608-element weights): the default
    reuse distance keeps all three resident; at 0 two modules' worth are in use."""
    cfg = _cfg("params_opt_nvme.json")
    zo = cfg["zero_optimization"]
    zo["offload_param"]["buffer_count"] = count
    if reuse is not None:
        zo["stage3_max_reuse_distance"] = reuse
    p = _preset(cfg)
    advice = [a for a in advise(p, cfg, estimate(p, cfg)) if "buffer_count" in a.setting]
    if need is None:
        assert advice == []
    else:
        (a,) = advice
        assert f"buffer_count {count} may be too few" in a.text
        assert f"up to {need} parameters" in a.text


# ------------------------------------------------------------- configs users bring


def _estimate(cfg: dict, tmp_path: Path, *args: str) -> Any:  # type: ignore[type-arg]
    from click.testing import CliRunner

    from iotune import cli as cli_mod

    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    ds = str(tmp_path / "ds.json")
    model = ("--model", str(DATA / "gpt_neox"), "--ds-config", ds, "--seq-len", "256")
    return CliRunner().invoke(cli_mod.cli, ["estimate", *model, *args], prog_name="iotune")


def test_a_hugging_face_trainer_config_is_filled_as_the_trainer_fills_it(
    tmp_path: Path,
) -> None:
    """transformers' ZeRO-3 NVMe example with the Trainer's "auto" values (and aio's old
    thread_count): filled by transformers' own integration from --micro-batch, --ga, --set
    dtype, the model's hidden size and TrainingArguments' defaults; each value said with
    where it came from; thread_count advice, not an error."""
    cfg = _cfg("hf_zero3_nvme.json")
    r = _estimate(cfg, tmp_path, "--micro-batch", "2", "--ga", "4", "--set", "dtype=bf16")
    assert r.exit_code == 0, r.output
    r = _estimate(cfg, tmp_path, "--json", "--micro-batch", "2", "--ga", "4", "--set", "dtype=bf16")
    doc = json.loads(r.stdout)
    filled = {f["key"]: f for f in doc["auto_filled"]}
    hidden = 256
    assert filled["zero_optimization.reduce_bucket_size"]["value"] == hidden * hidden
    assert filled["zero_optimization.stage3_prefetch_bucket_size"]["value"] == int(
        0.9 * hidden * hidden
    )
    assert filled["zero_optimization.stage3_param_persistence_threshold"]["value"] == 10 * hidden
    assert filled["train_micro_batch_size_per_gpu"]["value"] == 2
    assert filled["gradient_accumulation_steps"]["value"] == 4
    assert filled["train_batch_size"]["value"] == 8
    assert filled["bf16.enabled"]["value"] is True and filled["fp16.enabled"]["value"] is False
    assert filled["optimizer.params.lr"]["from"] == "TrainingArguments' default"
    assert "--micro-batch" in filled["train_micro_batch_size_per_gpu"]["from"]
    advice = {a["setting"]: a["text"] for a in doc["advice"]}
    assert "intra_op_parallelism" in advice["aio.thread_count"]
    assert "DeepSpeed ignores it" in advice["aio.thread_count"]


@pytest.mark.parametrize(
    ("args", "key", "option"),
    [
        (("--set", "dtype=bf16"), "train_micro_batch_size_per_gpu", "--micro-batch"),
        (("--micro-batch", "2"), "bf16.enabled", "--set dtype="),
    ],
)
def test_an_auto_value_iotune_cannot_fill_names_the_key_and_its_option(
    args: tuple[str, ...], key: str, option: str, tmp_path: Path
) -> None:
    r = _estimate(_cfg("hf_zero3_nvme.json"), tmp_path, *args)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 2, r.stderr
    assert f'{key} is "auto"' in lines[0] and option in lines[1], r.stderr


def test_aio_inside_zero_optimization_is_one_line_naming_where_it_belongs(
    tmp_path: Path,
) -> None:
    """transformers' docs nest aio in zero_optimization; DeepSpeed 0.19.8's zero config
    permits no extra keys and rejects it."""
    cfg = _cfg("hf_zero3_nvme.json")
    cfg["zero_optimization"]["aio"] = cfg.pop("aio")
    r = _estimate(cfg, tmp_path, "--micro-batch", "2", "--set", "dtype=bf16")
    assert r.exit_code == 2 and "aio is inside zero_optimization" in r.stderr, r.stderr
    assert 'move "aio" to the top level' in r.stderr


def test_an_ignored_aio_key_in_a_plain_config_is_advice(tmp_path: Path) -> None:
    cfg = _cfg("opt_nvme.json")
    cfg["aio"]["thread_count"] = 4
    cfg["aio"]["prefetch"] = True
    r = _estimate(cfg, tmp_path, "--json")
    assert r.exit_code == 0, r.output
    advice = {a["setting"]: a["text"] for a in json.loads(r.stdout)["advice"]}
    assert "set aio.intra_op_parallelism instead" in advice["aio.thread_count"]
    assert advice["aio.prefetch"].endswith("; remove it")


def test_a_warmup_an_older_transformers_fills_with_0_is_advice_and_1_for_our_runs() -> None:
    """Seen on a GPU machine's transformers: "auto" warmup filled with 0, which DeepSpeed
    0.19.8 refuses; the Trainer stopped in deepspeed.initialize."""
    from iotune.model.dsfile import warmup_below_one

    cfg: dict[str, Any] = {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}}
    filled = [("scheduler.params.warmup_num_steps", "0", "TrainingArguments' default")]
    (note,) = warmup_below_one(cfg, filled)
    assert note[0] == "scheduler.params.warmup_num_steps" and "refuses" in note[1]
    assert cfg["scheduler"]["params"]["warmup_num_steps"] == 1
    # a value the user wrote, or one filled with 1, is theirs
    assert warmup_below_one({"scheduler": {"params": {"warmup_num_steps": 0}}}, []) == []
    assert warmup_below_one({"scheduler": {"params": {"warmup_num_steps": 1}}}, filled) == []


def _no_worker(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"a worker was started: {args}")


@pytest.mark.parametrize("trainer", [False, True])
@pytest.mark.parametrize("as_file", [False, True])
def test_a_model_config_that_is_not_json_says_so_with_the_line_and_column(
    trainer: bool, as_file: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a hint about model_type: the file does not parse. Said before any worker reads it
    (the one filling a Trainer config's "auto" values reads the model's config too)."""
    model = tmp_path / "mine"
    model.mkdir()
    text = (DATA / "gpt_neox" / "config.json").read_text().replace('",', '"', 1)
    (model / "config.json").write_text(text)
    with pytest.raises(json.JSONDecodeError) as parsed:
        json.loads(text)
    err = parsed.value
    assert (err.msg, err.lineno, err.colno) == ("Expecting ',' delimiter", 3, 5)
    cfg = _cfg("hf_zero3_nvme.json" if trainer else "opt_nvme.json")
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    from click.testing import CliRunner

    from iotune import cli as cli_mod

    where = model / "config.json" if as_file else model
    args = ["estimate", "--model", str(where), "--ds-config", str(tmp_path / "ds.json")]
    if trainer:
        args += ["--micro-batch", "2", "--set", "dtype=bf16"]
    monkeypatch.setattr("iotune.proc.run_worker", _no_worker)
    r = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune")
    first, hint = r.stderr.strip().splitlines()
    assert r.exit_code == 2, r.output
    assert first == (
        f"iotune: error: {model / 'config.json'} is not JSON: Expecting ',' delimiter "
        "at line 3 column 5"
    ), first
    assert "model_type" not in r.stderr and hint.startswith("hint: ") and "JSON" in hint, hint


def test_a_model_config_that_is_not_an_object_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from iotune.model.custom import load_model

    monkeypatch.setattr("iotune.proc.run_worker", _no_worker)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(PresetError, match=r"config.json is not a JSON object") as info:
        load_model(str(tmp_path))
    assert info.value.hint and "{...}" in info.value.hint


def test_a_bad_deepspeed_set_on_your_model_is_refused_before_any_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("iotune.proc.run_worker", _no_worker)
    r = _estimate(
        _cfg("opt_nvme.json"), tmp_path, "--set", "ds.zero_optimization.sub_group_size=-1"
    )
    assert r.exit_code == 2 and r.stderr.startswith(
        "iotune: error: ds.zero_optimization.sub_group_size must be an integer of 0 or more, got -1"
    ), r.stderr
