"""Presets, the DeepSpeed config generator, the I/O model, preflight, data packing and the
run table, from pure logic and recorded run files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune.errors import UsageError
from iotune.model.dsconfig import check_ds_config, ds_config
from iotune.model.estimate import IoVolume, estimate
from iotune.model.geometry import Geometry
from iotune.model.hostram import pinned
from iotune.model.presets import (
    Preset,
    PresetError,
    apply_sets,
    get_preset,
    load_presets,
    parse_sets,
    parse_value,
    preset_with,
    resolve_dtype,
)
from iotune.probes.cpu import Bf16Support, bf16_support
from iotune.probes.sysfs import SysTree
from iotune.train import data as tdata
from iotune.train.preflight import Resources, Shortfall, preflight

DATA = Path(__file__).resolve().parent.parent / "data"
STRATEGIES = (
    "gpu_baseline",
    "opt_ram",
    "opt_ram_zenflow",
    "opt_nvme",
    "opt_raid0",
    "opt_nvme_zenflow",
    "opt_raid0_zenflow",
    "params_opt_nvme",
    "params_opt_raid0",
)


def invoke(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli_mod.cli, list(args), prog_name="iotune")
    return r.exit_code, r.stdout, r.stderr


def test_every_study_experiment_is_a_preset() -> None:
    ps = load_presets()
    for s in STRATEGIES:
        for size in ("1b", "2b", "3b", "4b", "8b", "16b"):
            for suffix, ga in (("", 1), ("_ga4", 4), ("_ga8", 8)):
                p = ps[f"{s}_{size}{suffix}"]
                assert p.ga == ga and p.seq_len == 4096 and p.strategy.name == s
                # ZenFlow runs without checkpointing (its transposed weights and the
                # recomputation do not mix): the only setting that differs from the study's
                assert p.gradient_checkpointing == (not p.strategy.zenflow)
                assert p.accelerator == "cuda"
    assert {"tiny_opt_nvme", "tiny_params_opt_nvme", "tiny_opt_ram"} <= set(ps)
    assert len(ps) == 9 * 6 * 3 + 3


@pytest.mark.parametrize(
    ("size", "params"),
    [
        ("1b", 1_235_814_400),  # Llama-3.2-1B
        ("3b", 3_212_749_824),  # Llama-3.2-3B
        ("8b", 8_030_261_248),  # Llama-3.1-8B
        ("2b", 1_965_672_448),
        ("4b", 4_018_105_344),
        ("16b", 16_100_405_248),
    ],
)
def test_sizes_have_the_documented_parameter_counts(size: str, params: int) -> None:
    assert get_preset(f"opt_nvme_{size}").geometry.param_count() == params


def test_llama_config_is_llama31_style() -> None:
    cfg = get_preset("opt_nvme_8b").geometry.llama_config()
    assert cfg["vocab_size"] == 128256 and cfg["num_key_value_heads"] == 8
    assert cfg["rope_theta"] == 500000.0 and cfg["head_dim"] == 128
    assert cfg["tie_word_embeddings"] is False
    assert get_preset("opt_nvme_1b").geometry.llama_config()["tie_word_embeddings"] is True


def test_nvme_below_stage_3_is_refused() -> None:
    p = apply_sets(get_preset("opt_nvme_1b"), {"ds.zero_optimization.stage": 2})
    with pytest.raises(PresetError, match="needs ZeRO stage 3, got stage 2"):
        ds_config(p)
    # a hand-written config too
    with pytest.raises(PresetError, match="silently keep"):
        check_ds_config(
            {
                "zero_optimization": {
                    "stage": 1,
                    "offload_optimizer": {"device": "nvme", "nvme_path": "/x"},
                }
            }
        )
    # RAM offload at stage 2 is a real configuration
    ds_config(apply_sets(get_preset("opt_ram_1b"), {"ds.zero_optimization.stage": 2}))


def test_strategies_map_to_deepspeed_sections() -> None:
    zo = ds_config(get_preset("opt_nvme_1b"), "/mnt/x")["zero_optimization"]
    assert zo["stage"] == 3 and zo["offload_optimizer"]["device"] == "nvme"
    assert zo["offload_optimizer"]["nvme_path"] == "/mnt/x" and "offload_param" not in zo
    cfg = ds_config(get_preset("params_opt_raid0_16b_ga8"))
    assert cfg["gradient_accumulation_steps"] == 8
    assert cfg["zero_optimization"]["offload_param"]["nvme_path"] == "/mnt/offload"
    assert cfg["aio"]["block_size"] == 524288 and "intra_op_parallelism" in cfg["aio"]
    zen = ds_config(get_preset("opt_raid0_zenflow_3b_ga8"))["zero_optimization"]
    assert zen["zenflow"]["topk_ratio"] == 0.1 and zen["offload_optimizer"]["device"] == "nvme"
    ram = ds_config(get_preset("opt_ram_zenflow_1b"))
    assert ram["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert "aio" not in ram
    base = ds_config(get_preset("gpu_baseline_1b"))
    assert base["zero_optimization"]["stage"] == 0 and base["optimizer"]["params"]["torch_adam"]


def test_aio_block_comes_from_the_argument_when_given() -> None:
    aio = {
        "block_size": 1048576,
        "queue_depth": 32,
        "intra_op_parallelism": 4,
        "single_submit": False,
        "overlap_events": True,
        "use_gds": False,
    }
    assert ds_config(get_preset("opt_nvme_1b"), aio=aio)["aio"] == aio


def test_sets_parse_and_apply() -> None:
    sets = parse_sets(
        ["steps=7", "model.num_hidden_layers=2", "ds.aio.queue_depth=32", "nvme_path=/x"]
    )
    p = apply_sets(get_preset("tiny_opt_nvme"), sets)
    assert p.steps == 7 and p.geometry.num_hidden_layers == 2 and p.nvme_path == "/x"
    assert ds_config(p)["aio"]["queue_depth"] == 32
    for bad, msg in (
        (["steps"], "not key=value"),
        (["bogus=1"], "unknown setting"),
        (["steps=0"], "positive integer"),
        (["model.colour=1"], "unknown model field"),
        (["accelerator=tpu"], "cuda or cpu"),
    ):
        with pytest.raises(PresetError, match=msg):
            apply_sets(get_preset("tiny_opt_nvme"), parse_sets(bad))


def test_opt_offload_model_is_16n_12n_24n() -> None:
    p = get_preset("opt_nvme_16b")
    e = estimate(p, ds_config(p))
    n = e.params
    # every sub-group is swapped; only the RMSNorm weights' gradients (4096 elements) are
    # under the 1 MiB minimum and stay in RAM
    assert e.swapped.n_s == n
    assert n - e.swapped.n_g == 4096 * (2 * 69 + 1)
    rel = pytest.approx
    assert e.nvme_bytes == rel(16 * n, rel=1e-4)
    assert (e.init_first.read, e.init_first.write) == rel((12 * n, 24 * n), rel=1e-4)
    assert (e.steady_step.read, e.steady_step.write) == rel((16 * n, 16 * n), rel=1e-4)
    # the seed study's 16B table: 211.9 / 158.9 / 317.9 (GiB) = 16 / 12 / 24 x 14.22e9
    n_study = 211.9 * 2**30 / 16
    assert 14.1e9 < n_study < 14.3e9
    assert abs(158.9 * 2**30 / n_study - 12) < 0.05 and abs(317.9 * 2**30 / n_study - 24) < 0.05
    # accumulation does not change it (micro-steps accumulate in RAM)
    p8 = get_preset("opt_nvme_16b_ga8")
    assert estimate(p8, ds_config(p8)).steady_step == e.steady_step


def test_params_offload_adds_2n_and_the_fetches() -> None:
    p = get_preset("params_opt_nvme_16b")
    e = estimate(p, ds_config(p))
    n = e.params
    n_p, n_g = e.swapped.n_p, e.swapped.n_g
    assert n_p == n - e.swapped.n + n_g  # the same tensors are over the minimum
    assert e.nvme_bytes == 12 * n + 4 * n_g + 2 * n_p  # untied: no orphaned lm_head file
    assert e.nvme_bytes == pytest.approx(18 * n, rel=1e-4)
    # DeepSpeed's initialisation reads the bf16 partitions twice (4N, measured); the first
    # step fetches every parameter three times (forward, recomputation, backward: 6N) and
    # reads the optimizer state (12N): the study's 22N
    assert e.init_first.read == pytest.approx(22 * n, rel=1e-4)
    # each partition is written once at construction, once more by DeepSpeed's initialisation,
    # and after the step (6N), besides the optimizer state's 24N: the study's 30N
    assert e.init_first.write == pytest.approx(30 * n, rel=1e-4)
    assert e.steady_step.write == pytest.approx(18 * n, rel=1e-4)
    # stage3_max_reuse_distance 0 (the presets'): after the first step, recomputation and
    # backward share a fetch (2 fetches per micro-step; 2.1 measured at 1B on an H100)
    assert ds_config(p)["zero_optimization"]["stage3_max_reuse_distance"] == 0
    assert e.steady_step.read == 12 * n + 4 * n_g + 4 * n_p
    ga4 = get_preset("params_opt_nvme_16b_ga4")
    assert estimate(ga4, ds_config(ga4)).steady_step.read == e.steady_step.read + 3 * 4 * n_p
    # with DeepSpeed's default distance (1e9) recomputation and backward share a fetch and
    # the first 1e9 elements of the trace stay between forward and recomputation
    dflt = apply_sets(p, {"ds.zero_optimization.stage3_max_reuse_distance": 1_000_000_000})
    e2 = estimate(dflt, ds_config(dflt))
    assert e2.steady_step.read == 12 * n + 4 * n_g + 2 * n_p + 2 * (n_p - 1_000_000_000)


def test_small_tensors_stay_in_ram() -> None:
    p = get_preset("tiny_opt_nvme")
    e = estimate(p, ds_config(p))
    # hidden 512: k/v projections (512 x 256 fp32 = 512 KiB) and norms are under 1 MiB
    assert e.swapped.n_s == e.params
    assert e.params - e.swapped.n_g == 4 * (2 * 512 * 256 + 2 * 512) + 512
    big = apply_sets(p, {"ds.aio.block_size": 4 * 2**20})
    assert estimate(big, ds_config(big)).swapped.n_g < e.swapped.n_g


NATIVE = Bf16Support(True, ("avx512_bf16",), ("avx2", "avx512f"), "native (avx512_bf16)")
EMULATED = Bf16Support(False, (), ("avx2",), "emulated: avx2, no avx512_bf16 or amx_bf16")


def test_cpu_dtype_follows_the_cpu_and_gpu_presets_stay_bf16() -> None:
    tiny, gpu = get_preset("tiny_opt_nvme"), get_preset("opt_nvme_1b")
    assert tiny.dtype == gpu.dtype == "auto"
    assert resolve_dtype(tiny, NATIVE).name == "bf16"
    auto = resolve_dtype(tiny, EMULATED)
    assert (auto.name, auto.native_bf16, auto.emulated_bf16) == ("fp32", False, False)
    assert "emulated: avx2" in auto.why and "float32" in auto.why
    forced = resolve_dtype(apply_sets(tiny, {"dtype": "bf16"}), EMULATED)
    assert forced.name == "bf16" and forced.emulated_bf16 and "--set dtype=bf16" in forced.why
    # GPU presets: bf16 whatever the CPU
    assert resolve_dtype(gpu, EMULATED).name == "bf16"
    assert ds_config(gpu)["bf16"] == {"enabled": True}
    fp32 = apply_sets(tiny, {"dtype": "fp32"})
    assert ds_config(fp32)["bf16"] == {"enabled": False}
    assert ds_config(apply_sets(tiny, {"dtype": "bf16"}))["bf16"] == {"enabled": True}
    with pytest.raises(PresetError, match="dtype must be"):
        apply_sets(tiny, {"dtype": "fp16"})
    with pytest.raises(PresetError, match="set from the preset"):
        apply_sets(tiny, {"ds.bf16.enabled": False})


def test_fp32_swaps_the_same_optimizer_state_and_4_byte_parameter_files() -> None:
    """DeepSpeed keeps the fp32 master, moments and gradients whatever the model dtype; a
    parameter file holds the model's dtype (partitioned_param_swapper.py swap_element_size),
    so in float32 every file doubles and more tensors reach the 1 MiB minimum."""
    p = get_preset("tiny_opt_nvme")
    bf, fp = (
        estimate(q, ds_config(q)) for q in (apply_sets(p, {"dtype": d}) for d in ("bf16", "fp32"))
    )
    assert (bf.nvme_bytes, bf.steady_step, bf.init_first) == (
        fp.nvme_bytes,
        fp.steady_step,
        fp.init_first,
    )
    q = get_preset("tiny_params_opt_nvme")
    bf, fp = (
        estimate(x, ds_config(x)) for x in (apply_sets(q, {"dtype": d}) for d in ("bf16", "fp32"))
    )
    # bf16: gate/up/down (512 x 1536 = 1.5 MiB) and the embedding; float32 adds q_proj and
    # o_proj (512 x 512 = 1 MiB)
    assert bf.swapped.n_p == 4 * 3 * 512 * 1536 + 32000 * 512
    assert fp.swapped.n_p == bf.swapped.n_p + 4 * 2 * 512 * 512
    orphan = 32000 * 512  # lm_head's own file, written once before tying
    opt = bf.nvme_bytes - 2 * bf.swapped.n_p - 2 * orphan
    assert fp.nvme_bytes == opt + 4 * fp.swapped.n_p + 4 * orphan
    assert fp.steady_step.write - 4 * fp.swapped.n_p == bf.steady_step.write - 2 * bf.swapped.n_p
    assert fp.host is not None and bf.host is not None
    assert fp.host.gradients == 2 * bf.host.gradients  # accumulated in the model dtype


def test_cpu_flags_decide_native_bf16(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    info = tmp_path / "proc" / "cpuinfo"
    tree = SysTree(tmp_path)
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    epyc = bf16_support(tree, env={}, machine="x86_64")
    assert not epyc.native and epyc.found == () and epyc.simd == ("avx2",)
    assert epyc.why == "emulated: avx2, no avx512_bf16 or amx_bf16 in /proc/cpuinfo"
    info.write_text("flags\t\t: avx2 avx512f avx512_bf16 amx_bf16\n")
    spr = bf16_support(tree, env={}, machine="x86_64")
    assert spr.native and spr.found == ("avx512_bf16", "amx_bf16")
    # oneDNN capped below its bf16 instructions emulates bf16 on any CPU
    capped = bf16_support(tree, env={"ONEDNN_MAX_CPU_ISA": "avx2"}, machine="x86_64")
    assert not capped.native and "ONEDNN_MAX_CPU_ISA=AVX2" in capped.why
    assert bf16_support(
        tree, env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, machine="x86_64"
    ).native
    info.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 sve\n")
    assert bf16_support(tree, env={}, machine="aarch64").native


def test_preflight_names_every_shortfall() -> None:
    p = get_preset("opt_nvme_16b")
    e = estimate(p, ds_config(p))
    res = Resources(
        gpu_name="H100", gpu_bytes=80 * 2**30, ram_available=60 * 2**30, nvme_free=61 * 2**30
    )
    short = preflight(e, res, "/mnt/offload")
    assert [s.what for s in short] == ["free", "of host RAM"]
    assert short[0].describe().startswith("≈ 244.8 GiB free at /mnt/offload, found 61.0 GiB")
    roomy = Resources("H100", 80 * 2**30, 512 * 2**30, 4 * 2**40)
    assert preflight(e, roomy, "/mnt/offload") == []
    base = get_preset("gpu_baseline_8b")
    short = preflight(estimate(base, ds_config(base)), roomy, None)
    assert [s.what for s in short] == ["of GPU memory"]
    assert (
        Shortfall("of GPU memory", 2**31, None, "on a CUDA GPU").describe().endswith("found none")
    )
    # figures that round alike are shown apart (a root test's resume was refused with
    # "needs ≈ 0.5 GiB free ..., found 0.5 GiB")
    mib = 2**20
    for need, have, said in (
        (540 * mib, 530 * mib, "≈ 0.53 GiB free at /x, found 0.52 GiB"),
        (int(0.5004 * 2**30), int(0.5001 * 2**30), "≈ 512.4 MiB free at /x, found 512.1 MiB"),
        (mib + 7, mib + 3, "≈ 1,048,583 bytes free at /x, found 1,048,579 bytes"),
    ):
        assert Shortfall("free", need, have, "at /x").describe() == said


def test_pack_and_byte_tokens(tmp_path: Path) -> None:
    f = tmp_path / "wiki.txt"
    f.write_text(" = Title = \n\n First paragraph .\n\n Second one .\n")
    docs = list(tdata.read_texts(f))
    assert docs == [" = Title = \n", " First paragraph .\n", " Second one .\n"]
    ids = list(tdata.byte_tokens(docs))
    assert ids.count(tdata.BYTE_EOS) == 3 and max(ids) == 256
    blocks = tdata.pack(ids, 8)
    assert blocks.shape == (len(ids) // 8, 8) and blocks.dtype == np.int32
    with pytest.raises(UsageError, match="fewer than one 4096-token block"):
        tdata.pack(ids, 4096)
    j = tmp_path / "d.jsonl"
    j.write_text('{"text": "a"}\n\n{"text": "bc"}\n{"other": 1}\n')
    assert list(tdata.read_texts(j)) == ["a", "bc"]
    info = tdata.prepare(f, 8, 32000, tmp_path / "b.npy")
    assert info["n_blocks"] == blocks.shape[0] and np.load(tmp_path / "b.npy").shape == blocks.shape
    with pytest.raises(UsageError, match="unknown format"):
        list(tdata.read_texts(tmp_path / "b.npy"))


def test_presets_cli_lists_and_shows() -> None:
    code, out, _ = invoke("--json", "presets", "list", "--size", "tiny")
    assert code == 0
    rows = json.loads(out)
    assert [r["name"] for r in rows] == ["tiny_opt_nvme", "tiny_opt_ram", "tiny_params_opt_nvme"]
    assert rows[0]["params"] == 28_971_520 and rows[0]["accelerator"] == "cpu"
    code, out, _ = invoke("presets", "show", "opt_nvme_16b")
    assert code == 0
    assert "16,100,405,248 parameters" in out and '"device": "nvme"' in out and "24.0N" in out
    code, out, _ = invoke("presets")
    assert code == 0 and "opt_raid0_zenflow_3b_ga8" in out


def test_estimate_cli_and_errors() -> None:
    code, out, _ = invoke("--json", "estimate", "opt_nvme_1b")
    assert code == 0
    doc = json.loads(out)
    n = doc["params"]
    assert doc["nvme_bytes"] == pytest.approx(16 * n, rel=1e-4)
    assert doc["init_first"]["read"] == pytest.approx(12 * n, rel=1e-4)
    assert doc["init_first"]["write"] == pytest.approx(24 * n, rel=1e-4)
    code, _, err = invoke("estimate", "opt_nvme_17b")
    assert code == 2 and "no preset named 'opt_nvme_17b'" in err and "hint:" in err
    code, _, err = invoke("estimate", "opt_nvme_1b", "--set", "ds.zero_optimization.stage=1")
    assert code == 2 and "needs ZeRO stage 3" in err and "Traceback" not in err
    code, _, err = invoke("trace", "--steps", "3", "--duration", "1")
    assert code == 2 and "--steps belongs to --run PRESET" in err
    code, _, err = invoke("trace", "--run", "tiny_opt_nvme", "--duration", "1")
    assert code == 2 and "drop --duration" in err


def test_aio_config_is_read_from_a_sweep_run_or_a_ds_config(tmp_path: Path) -> None:
    aio = {
        "block_size": 1048576,
        "queue_depth": 16,
        "intra_op_parallelism": 2,
        "single_submit": False,
        "overlap_events": True,
        "use_gds": False,
    }
    run = tmp_path / "sweep-1"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({"aio": aio, "best": {}}))
    code, out, _ = invoke("--json", "estimate", "opt_nvme_1b", "--aio-config", str(run))
    assert code == 0 and json.loads(out)["params"] > 0
    (tmp_path / "bad.json").write_text("{}")
    code, _, err = invoke("estimate", "opt_nvme_1b", "--aio-config", str(tmp_path / "bad.json"))
    assert code == 2 and 'no "aio" block' in err


def test_run_table_from_recorded_run(tmp_path: Path) -> None:
    """build_result on the files a real tiny_opt_nvme run left (tests/data/run-tiny-opt-nvme)."""
    from iotune.trace.targets import Targets
    from iotune.train.request import Prepared, RunRequest
    from iotune.train.results import build_result, write_result

    src = DATA / "run-tiny-opt-nvme"
    out = tmp_path / "run"
    shutil.copytree(src, out)
    # the worker's "ready" event (imports done) comes first and is not a row of the table
    lines = (out / "steps.jsonl").read_text()
    (out / "steps.jsonl").write_text('{"event": "ready", "import_s": 4.5}\n' + lines)
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
        Targets(disks=("loop0",)),
    )
    trace = json.loads((out / "trace.json").read_text())
    req = RunRequest(preset=p, out=out, backend="bcc")
    res = build_result(req, prep, trace, 0.0)
    first, steady = res["table"]
    assert first["case"] == "init + first step" and steady["case"] == "steady step (median of 2)"
    init_io, s1 = trace["steps"][0], trace["steps"][1]
    assert first["read_bytes"] == init_io["read"]["bytes"] + s1["read"]["bytes"]
    assert (
        first["write_focus"] == init_io["write"]["focus_requests"] + s1["write"]["focus_requests"]
    )
    events = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()][1:]
    assert res["import_s"] == 4.5 and [e["event"] for e in res["events"]][:2] == ["init", "step"]
    assert first["step_s"] == events[1]["step_s"]
    assert steady["optimizer_s"] == round(
        sorted([events[2]["optimizer_s"], events[3]["optimizer_s"]])[0] / 2
        + sorted([events[2]["optimizer_s"], events[3]["optimizer_s"]])[1] / 2,
        4,
    )
    assert res["footprint"]["allocated"] == max(e["swap"]["allocated"] for e in events)
    write_result(out, res)
    md = (out / "result.md").read_text()
    # the study's columns in GiB (what its "GB" means), the focus size as 512 KiB
    assert "| Case | Space on NVMe, GiB | Read, GiB | Write, GiB |" in md
    assert "R, 512 KiB" in md and md.count("| tiny_opt_nvme: ") == 4
    assert first["read_gib"] == round(first["read_bytes"] / 2**30, 4)
    assert (out / "result.csv").read_text().count("\n") == 5
    from rich.console import Console

    from iotune.train.render import print_run

    con = Console(record=True, width=200)
    print_run(con, res)
    assert "init + first step" in con.export_text()


def test_bad_overrides_are_refused_with_a_hint() -> None:
    p = get_preset("tiny_opt_nvme")
    for sets, msg in (
        ({"model.hidden_size": 2.5}, "positive integer"),
        ({"model.num_attention_heads": 0}, "positive integer"),
        ({"model.hidden_size": 500}, "does not divide"),
        ({"model.num_key_value_heads": 3}, "does not divide"),
        ({"model.tie_word_embeddings": "yes"}, "true or false"),
        ({"ds.aio.block_size": "1M"}, "aio.block_size must be a positive integer"),
        ({"ds.zero_optimization.stage": "x"}, "ZeRO stage must be 0, 1, 2 or 3"),
        ({"ds.zero_optimization.offload_optimizer": None}, "must be a section"),
        ({"ds.gradient_accumulation_steps": 4}, "set from the preset"),
    ):
        with pytest.raises(PresetError, match=msg):
            ds_config(apply_sets(p, sets))
    assert apply_sets(p, {"seed": 0}).seed == 0


def test_run_refuses_bad_data_and_a_used_run_directory(tmp_path: Path) -> None:
    (tmp_path / "x.csv").write_text("a,b\n")
    code, _, err = invoke("run", "tiny_opt_nvme", "--data", str(tmp_path / "x.csv"))
    assert code == 2 and "unknown format .csv" in err and "hint:" in err
    code, _, err = invoke("run", "tiny_opt_nvme", "--data", str(tmp_path / "none.txt"))
    assert code == 2 and "no such file" in err
    code, _, err = invoke("run", "tiny_opt_nvme", "--tokenizer", str(tmp_path))
    assert code == 2 and "not a Hugging Face tokenizer directory" in err
    used = tmp_path / "used"
    used.mkdir()
    (used / "run.json").write_text("{}")
    code, _, err = invoke("run", "tiny_opt_ram", "--out", str(used))
    assert code == 2 and "is not empty" in err and "Traceback" not in err


def test_ops_for_names_every_op_the_run_would_build_at_start_up() -> None:
    from iotune.train.preflight import ops_for

    def ops(name: str) -> list[str]:
        p = get_preset(name)
        return ops_for(ds_config(p, "/mnt/x" if p.strategy.uses_nvme else None), p.accelerator)

    assert ops("tiny_opt_nvme") == ["ShareMemCommBuilder", "CPUAdamBuilder", "AsyncIOBuilder"]
    assert ops("tiny_opt_ram") == ["ShareMemCommBuilder", "CPUAdamBuilder"]
    assert ops("opt_nvme_1b") == ["CPUAdamBuilder", "AsyncIOBuilder"]
    assert ops("params_opt_nvme_1b") == ["CPUAdamBuilder", "AsyncIOBuilder"]
    assert ops("opt_ram_zenflow_1b") == ["CPUAdamBuilder"]
    assert ops("gpu_baseline_1b") == []


def test_data_and_tokenizer_are_checked_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "wiki.TXT").write_text("text\n")
    tdata.check_inputs(str(tmp_path / "wiki.TXT"), None)
    tdata.check_inputs(None, None)
    with pytest.raises(UsageError, match=r"--data .*none\.txt: no such file"):
        tdata.check_inputs(str(tmp_path / "none.txt"), None)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(UsageError, match=r"unknown format \.csv"):
        tdata.check_inputs(str(tmp_path / "x.csv"), None)
    (tmp_path / "README").write_text("a\n")
    with pytest.raises(UsageError, match=r"unknown format \(none\)"):
        tdata.check_inputs(str(tmp_path / "README"), None)
    with pytest.raises(UsageError, match="not a Hugging Face tokenizer directory") as info:
        tdata.check_inputs(None, str(tmp_path))
    assert info.value.hint and "save_pretrained(DIR)" in info.value.hint
    (tmp_path / "tokenizer_config.json").write_text("{}")
    tdata.check_inputs(str(tmp_path / "wiki.TXT"), str(tmp_path))


def test_preset_with_overrides_and_steps() -> None:
    p = preset_with("tiny_opt_nvme", ("seq_len=64", "steps=9"), steps=2)
    assert (p.name, p.seq_len, p.steps) == ("tiny_opt_nvme", 64, 2)
    assert preset_with("tiny_opt_nvme", ()) == get_preset("tiny_opt_nvme")
    # the preset is looked up before the overrides are read
    with pytest.raises(PresetError, match="no preset named 'nope'"):
        preset_with("nope", ("not-key-value",))


def test_the_studys_16b_cases_fit_its_96_gb_host() -> None:
    """The study trained N ~ 14.2e9 (its table's 211.9 GiB = 16N) on 96 GB of RAM: the 16b
    geometry with 60 layers is that size, and both NVMe strategies fit, peak included."""
    for name in ("opt_nvme_16b", "params_opt_nvme_16b"):
        p = apply_sets(get_preset(name), {"model.num_hidden_layers": 60})
        e = estimate(p, ds_config(p))
        assert 14.1e9 < e.params < 14.3e9
        assert e.host is not None and e.host_bytes == e.host.peak
        assert e.host_bytes <= 90 * 2**30, (name, e.host_bytes / 2**30)
        terms = dict(e.host.terms())
        # the bf16 gradient partitions are the largest term: 2N, pinned and rounded up
        assert terms["gradient partitions (bf16, pinned)"] == 1 << (2 * e.params - 1).bit_length()
        # buffer_count 4 x the largest sub-group, which sub_group_size 1e8 makes the largest
        # tensor (lm_head, 128256 x 4096, with the three norms of 4096 before it in its group)
        assert e.swapped.largest_param == 128256 * 4096
        assert e.swapped.largest_subgroup == 128256 * 4096 + 3 * 4096
        assert terms["optimizer swap buffers (locked)"] == 4 * 4 * e.swapped.largest_subgroup
    # DeepSpeed's default sub_group_size (1e9) makes the swap buffers ~4x larger
    p = apply_sets(get_preset("opt_nvme_1b"), {"ds.zero_optimization.sub_group_size": 10**9})
    e = estimate(p, ds_config(p))
    assert e.host is not None and e.host.swap_buffers == 16 * e.swapped.largest_subgroup
    assert e.swapped.largest_subgroup > 10**9


def test_zenflow_runs_at_stage_3_and_refuses_what_cannot_run() -> None:
    for name in ("opt_ram_zenflow_1b", "opt_nvme_zenflow_1b", "opt_raid0_zenflow_1b"):
        p = get_preset(name)
        cfg = ds_config(p, "/mnt/x")
        zo = cfg["zero_optimization"]
        assert zo["stage"] == 3 and zo["zenflow"]["overlap_step"] is False
        assert not p.gradient_checkpointing and not p.zero_init
    p = get_preset("opt_nvme_zenflow_1b")
    with pytest.raises(PresetError, match="gradient checkpointing fails on the recomputation"):
        ds_config(apply_sets(p, {"gradient_checkpointing": True}), "/mnt/x")
    with pytest.raises(PresetError, match="overlap_step and the optimizer state on NVMe"):
        ds_config(apply_sets(p, {"ds.zero_optimization.zenflow.overlap_step": True}), "/mnt/x")
    # ZenFlow with NVMe at stage 1/2 would run from RAM: refused like any NVMe below stage 3
    with pytest.raises(PresetError, match="needs ZeRO stage 3"):
        ds_config(apply_sets(p, {"ds.zero_optimization.stage": 2}), "/mnt/x")
    # ZenFlow's stage-3 code allocates on "cuda" itself: DS_ACCELERATOR=cpu cannot run it
    with pytest.raises(PresetError, match="needs a CUDA GPU"):
        ds_config(apply_sets(p, {"accelerator": "cpu"}), "/mnt/x")
    # the refusals are one line with a hint on the command line too
    code, _, err = invoke("estimate", "opt_nvme_zenflow_1b", "--set", "gradient_checkpointing=true")
    assert code == 2 and "gradient_checkpointing=false" in err and "Traceback" not in err


def test_zenflow_moves_nvme_bytes_only_at_update_boundaries() -> None:
    from iotune.train.results import _update_window

    z = get_preset("opt_nvme_zenflow_1b")
    plain = get_preset("opt_nvme_1b")
    ez = estimate(z, ds_config(z, "/mnt/x"))
    ep = estimate(plain, ds_config(plain, "/mnt/x"))
    assert ez.update_interval == 4
    assert ez.init == ep.init and ez.nvme_bytes == ep.nvme_bytes
    assert ez.first_step.read == ez.first_step.write == 0 and ez.steady_step.read == 0
    assert ez.first_update == ep.first_step and ez.update == ep.steady_step
    mean = ez.interval_mean(first=False)
    assert mean is not None and mean.read == ep.steady_step.read // 4
    assert ep.update is None and ep.interval_mean(first=True) is None
    steps = [{"step": n, "step_s": 1.0} for n in range(1, 10)]
    assert [s["step"] for s in _update_window(steps, 4)] == [5, 6, 7, 8]
    assert [s["step"] for s in _update_window(steps[:5], 4)] == [1, 2, 3, 4]
    assert _update_window(steps[:3], 4) == [] and _update_window(steps, 1) == []


def test_estimate_prints_the_host_ram_breakdown() -> None:
    code, out, err = invoke("estimate", "opt_nvme_1b")
    text = out + err
    assert code == 0
    for term in ("gradient partitions (bf16, pinned)", "optimizer swap buffers (locked)",
                 "peak at the first step", "GiB peak"):  # fmt: skip
        assert term in text, term
    assert "READ GiB" in text and "GB = 10^9" not in text


def test_the_studys_figures_are_data_printed_beside_the_estimate() -> None:
    from iotune.model.published import load_study, study_row

    doc = load_study()
    row = study_row(get_preset("opt_nvme_16b"))
    assert row is not None and row.case == "Opt-state to NVMe"
    # in GiB the study's own figures are 16N / 12N / 24N of its N
    assert row.per_n(row.space_gib) == pytest.approx(16, abs=0.01)
    assert row.per_n(row.read_gib) == pytest.approx(12, abs=0.01)
    assert row.per_n(row.write_gib) == pytest.approx(24, abs=0.01)
    assert row.write_focus == 650993 and row.optimizer_s == 97.66
    raid = study_row(get_preset("params_opt_raid0_16b"))
    assert raid is not None and raid.step_s == 64.41 and raid.read_gib is None
    assert study_row(get_preset("opt_nvme_1b")) is None
    assert study_row(get_preset("opt_nvme_16b_ga4")) is None
    assert doc["adam_threads"]["optimizer_ms"][0] == 1833.75
    code, out, err = invoke("estimate", "opt_nvme_16b")
    text = out + err
    assert code == 0 and "study     'Opt-state to NVMe'" in text
    assert "read 158.9 GiB (12.0N)" in text and "init + first step read 12.0N" in text
    assert "DeepSpeed's default (1e9) would peak at" in text


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("zero_optimization.sub_group_size", "-1", "an integer of 0 or more, got -1"),
        ("zero_optimization.reduce_bucket_size", "0", "a positive integer, got 0"),
        ("zero_optimization.stage3_max_reuse_distance", "-5", "an integer of 0 or more"),
        ("zero_optimization.offload_optimizer.buffer_count", "0", "a positive integer, got 0"),
        ("zero_optimization.offload_param.buffer_size", "-4096", "a positive integer"),
        ("zero_optimization.offload_param.max_in_cpu", "-1", "an integer of 0 or more"),
        ("zero_optimization.sub_group_size", "1.5", "an integer of 0 or more, got 1.5"),
        ("zero_optimization.sub_group_size", "true", "an integer of 0 or more, got True"),
        ("zero_optimization.sub_group_size", "lots", "an integer of 0 or more, got 'lots'"),
        ("aio.queue_depth", "0", "a positive integer, got 0"),
        ("aio.block_size", "-524288", "a positive integer"),
        ("zero_optimization.offload_optimizer.ratio", "1.5", "a number from 0 to 1, got 1.5"),
        ("zero_optimization.zenflow.topk_ratio", "0", "a number above 0 and below 1, got 0"),
        ("zero_optimization.zenflow.update_interval", "0", 'a positive integer or "auto"'),
        ("steps_per_print", "0", "a positive integer, got 0"),
        ("gradient_clipping", "-1.0", "a number of 0 or more, got -1.0"),
    ],
)
def test_a_deepspeed_value_that_makes_no_sense_is_refused_naming_its_key(
    key: str, value: str, says: str
) -> None:
    code, out, err = invoke("estimate", "tiny_opt_nvme", "--set", f"ds.{key}={value}")
    assert code == 2 and out == "", (code, out, err)
    first, hint = err.splitlines()
    assert first.startswith(f"iotune: error: ds.{key} must be ") and says in first, first
    assert hint.startswith(f"hint: e.g. --set ds.{key}="), hint
    # the same rule on a section given whole, and on a preset's own [preset.X.set] table
    section, _, leaf = key.rpartition(".")
    if section:
        with pytest.raises(PresetError, match=f"ds.{key} must be "):
            apply_sets(get_preset("tiny_opt_nvme"), {f"ds.{section}": {leaf: parse_value(value)}})


def test_deepspeed_values_in_range_are_taken_and_integral_floats_become_integers() -> None:
    p = apply_sets(
        get_preset("tiny_params_opt_nvme"),
        parse_sets(
            [
                "ds.zero_optimization.sub_group_size=1e8",
                "ds.zero_optimization.sub_group_size=0",
                "ds.zero_optimization.stage3_max_reuse_distance=0",
                "ds.zero_optimization.offload_param.max_in_cpu=0",
                "ds.gradient_clipping=0",
            ]
        ),
    )
    assert p.ds_set["ds.zero_optimization.sub_group_size"] == 0
    zen = apply_sets(p, parse_sets(['ds.zero_optimization.zenflow.update_interval="auto"']))
    assert zen.ds_set["ds.zero_optimization.zenflow.update_interval"] == "auto"
    p = apply_sets(p, parse_sets(["ds.zero_optimization.sub_group_size=1e8"]))
    value = p.ds_set["ds.zero_optimization.sub_group_size"]
    assert value == 100_000_000 and type(value) is int
    assert ds_config(p)["zero_optimization"]["sub_group_size"] == 100_000_000


def test_the_deepspeed_bounds_are_never_looser_than_deepspeeds_own() -> None:
    """Each key the --set rules bound that DeepSpeed's pydantic config classes bound too: the
    rule refuses at least what DeepSpeed refuses (deepspeed/runtime/zero/config.py,
    offload_config.py, zenflow_config.py)."""
    import os

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zenflow.zenflow_config import ZenFlowConfig
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    from iotune.model.dsbounds import DS_BOUNDS

    classes = {
        "zero_optimization": DeepSpeedZeroConfig,
        "zero_optimization.offload_optimizer": DeepSpeedZeroOffloadOptimizerConfig,
        "zero_optimization.offload_param": DeepSpeedZeroOffloadParamConfig,
        "zero_optimization.zenflow": ZenFlowConfig,
    }
    compared = 0
    for cls_at, cls in classes.items():
        for name, f in cls.model_fields.items():
            for meta in f.metadata:
                for key in {f"{cls_at}.{name}", f"{cls_at}.{f.alias or name}"}:
                    bound = DS_BOUNDS.get(key)
                    if bound is None:
                        continue
                    compared += 1
                    if (ge := getattr(meta, "ge", None)) is not None:
                        assert bound.least >= ge, key
                    if (gt := getattr(meta, "gt", None)) is not None:
                        assert bound.least > gt or (bound.least == gt and bound.above), key
                    if (le := getattr(meta, "le", None)) is not None:
                        assert bound.most is not None and bound.most <= le, key
                    if (lt := getattr(meta, "lt", None)) is not None:
                        assert bound.most is not None and bound.most <= lt and bound.below, key
    assert compared >= 12
    for key in DS_BOUNDS:  # every bounded key is one DeepSpeed's config has
        section, _, leaf = key.rpartition(".")
        if section in classes:
            fields_ = classes[section].model_fields
            assert leaf in fields_ or leaf in {f.alias for f in fields_.values()}, key


# ------------------------------------------------------------- parameters on NVMe: what stays


def _trainer_template(ga: int = 4, hidden: int = 1024) -> dict[str, Any]:
    """The Hugging Face Trainer's documented ZeRO-3 template with the parameters on NVMe
    (tests/data/custom/hf_zero3_params_nvme.json), its "auto" values as the Trainer fills
    them for bf16, micro-batch 1 and *ga* (transformers.integrations.deepspeed)."""
    cfg: dict[str, Any] = json.loads((DATA / "custom" / "hf_zero3_params_nvme.json").read_text())
    fill = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": ga,
        "train_batch_size": ga,
        "gradient_clipping": 1.0,
        "zero_optimization.reduce_bucket_size": hidden * hidden,
        "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
    }
    for key, value in fill.items():
        node = cfg
        *path, leaf = key.split(".")
        for part in path:
            node = node[part]
        node[leaf] = value
    cfg["bf16"] = {"enabled": True}
    cfg["fp16"] = {"enabled": False}
    return cfg


def _trainer_preset(cfg: dict[str, Any], ga: int = 4) -> Preset:
    """A 0.29B Llama (h1024 i3584 L16, vocab 32000, untied) under a user's config."""
    from iotune.model.custom import strategy_of

    g = Geometry(
        hidden_size=1024,
        intermediate_size=3584,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=False,
        vocab_size=32000,
    )
    return Preset(
        name="llama-0.29b+hf",
        size="custom",
        geometry=g,
        strategy=strategy_of(cfg, "ds.json"),
        ga=ga,
        micro_batch=1,
        seq_len=1024,
        steps=3,
        accelerator="cuda",
        nvme_path="/local_nvme",
        deepspeed=cfg,
        dtype="bf16",
        ds_user=True,
    )


def test_the_trainer_template_keeps_a_small_model_in_cpu_memory() -> None:
    """The Trainer's ZeRO-3 template with the parameters on NVMe, 0.29B, GA 4, bf16 (measured
    on an H200: steady steps read 16N and wrote 16N, no parameter read back): max_in_cpu
    (DeepSpeed's default, 1e9 elements) holds the whole model, so deepspeed.initialize reads
    every parameter file once into pinned CPU memory and the drive sees only the optimizer
    state. The files stay (the footprint), written once by zero.Init."""
    cfg = _trainer_template()
    assert "max_in_cpu" not in cfg["zero_optimization"]["offload_param"]
    p = _trainer_preset(cfg)
    e = estimate(p, ds_config(p))
    n, sw = e.params, e.swapped
    assert 0.285e9 < n < 0.295e9
    assert sw.n_p > 0.99 * n and (sw.n_r, sw.n_k) == (0, 0)
    optimizer = 12 * sw.n_s + 4 * sw.n_g
    assert e.steady_step == IoVolume(optimizer, optimizer)
    assert e.steady_step.read / n == pytest.approx(16, abs=0.01)  # was 24N
    assert e.steady_step.write / n == pytest.approx(16, abs=0.01)  # was 18N
    # zero.Init writes every file; initialisation reads each once into the CPU buffer
    assert e.init == IoVolume(4 * sw.n_s + 2 * sw.n_p, 8 * sw.n_s + 2 * sw.n_p)
    assert e.first_step == IoVolume(4 * sw.n_s + 4 * sw.n_g, 12 * sw.n_s + 4 * sw.n_g)
    assert e.nvme_bytes == optimizer + 2 * sw.n_p
    assert not e.caveats
    # the pinned CPU copy of the model, and no write-back buffer (nothing is written back)
    assert e.host is not None
    bufs = 2 * 5 * 100_000_000
    assert e.host.param_buffers == bufs + pinned(2 * n)
    # GPU memory, the buffers and the live-parameter limit move no byte
    for key, value in (
        ("stage3_max_live_parameters", 10_000_000),
        ("stage3_max_reuse_distance", 0),
        ("offload_param.buffer_count", 64),
        ("offload_param.buffer_size", 40_000_000),
    ):
        q = apply_sets(p, {f"ds.zero_optimization.{key}": value})
        assert estimate(q, ds_config(q)).steady_step == e.steady_step, key


def test_max_in_cpu_keeps_whole_subgroups_from_the_first() -> None:
    """DeepSpeed fills max_in_cpu's CPU buffer with the optimizer's sub-groups in order, each
    whole or not at all (zero/stage3.py:984-993): the parameters of the sub-groups after it
    stay on the drive, are read at every use and written after every step."""
    from iotune.model.swapfiles import (
        IN_CPU,
        NO_FILE,
        ON_NVME,
        _subgroup_indices,
        parameter_placement,
        rank_tensors,
    )

    p = get_preset("params_opt_nvme_1b")  # sub_group_size 1e8, max_in_cpu 0, distance 0
    cfg = ds_config(p)
    assert cfg["zero_optimization"]["offload_param"]["max_in_cpu"] == 0
    base = estimate(p, cfg)
    assert base.swapped.n_r == base.swapped.n_p  # the presets stream every parameter
    tensors = rank_tensors(p)
    groups = _subgroup_indices(p, cfg)
    sizes = [sum(tensors[i] for i in g) for g in groups]
    # DeepSpeed's default, 1e9 elements, at 1.24B: the sub-groups up to 1e9 stay in RAM
    q = apply_sets(p, {"ds.zero_optimization.offload_param.max_in_cpu": 1_000_000_000})
    place = parameter_placement(q, ds_config(q))
    k = max(j for j in range(len(sizes) + 1) if sum(sizes[:j]) <= 1_000_000_000)
    assert 0 < k < len(groups)
    for j, g in enumerate(groups):
        for i in g:
            big = 2 * tensors[i] >= 1 << 20
            want = (IN_CPU if j < k else ON_NVME) if big else NO_FILE
            assert place[i] == want, (j, i)
    e = estimate(q, ds_config(q))
    n_r = sum(tensors[i] for g in groups[k:] for i in g if 2 * tensors[i] >= 1 << 20)
    assert e.swapped.n_r == n_r and e.swapped.n_p == base.swapped.n_p
    optimizer = 12 * e.swapped.n_s + 4 * e.swapped.n_g
    # stage3_max_reuse_distance 0: forward, then recomputation + backward (2 fetches)
    assert e.steady_step == IoVolume(optimizer + 2 * 2 * n_r, optimizer + 2 * n_r)
    n_p = e.swapped.n_p
    # the kept ones are read once at initialisation, not twice, and not written back
    assert base.init == e.init + IoVolume(2 * (n_p - n_r), 2 * (n_p - n_r))
    assert e.nvme_bytes == base.nvme_bytes  # every file stays, used or not
    # the whole model fits: no parameter I/O after initialisation, no write-back buffer
    whole = apply_sets(p, {"ds.zero_optimization.offload_param.max_in_cpu": sum(tensors)})
    w = estimate(whole, ds_config(whole))
    assert w.swapped.n_r == 0 and w.steady_step == IoVolume(optimizer, optimizer)
    assert base.host is not None and w.host is not None
    s_max = base.swapped.largest_subgroup
    assert base.host.param_buffers - w.host.param_buffers == 2 * s_max - pinned(2 * sum(tensors))
    # one element short: the last sub-group (the output layer) goes back to the drive
    short = apply_sets(p, {"ds.zero_optimization.offload_param.max_in_cpu": sum(tensors) - 1})
    assert estimate(short, ds_config(short)).swapped.n_r == sum(
        tensors[i] for i in groups[-1] if 2 * tensors[i] >= 1 << 20
    )


def test_persistent_parameters_on_the_drive_are_read_once_a_step() -> None:
    """A parameter at or below stage3_param_persistence_threshold elements is never released
    after use: on the drive, it is read once after each optimizer step, whatever the
    accumulation, and written back like the others (measured on the CPU, tiny GPT-NeoX)."""
    p = apply_sets(
        get_preset("params_opt_nvme_1b_ga4"),
        {"ds.zero_optimization.stage3_param_persistence_threshold": 2048 * 2048},
    )
    e = estimate(p, ds_config(p))
    sw = e.swapped
    # q_proj and o_proj (2048 x 2048) of every layer, and k/v (2048 x 512)
    assert sw.n_k == 16 * (2 * 2048 * 2048 + 2 * 2048 * 512)
    optimizer = 12 * sw.n_s + 4 * sw.n_g
    fetched = sw.n_r - sw.n_k
    assert e.steady_step == IoVolume(
        optimizer + 4 * 2 * 2 * fetched + 2 * sw.n_k, optimizer + 2 * sw.n_r
    )
    # the first step: the recording releases them like any other (three reads), the
    # second micro-step reads them again and keeps them, the optimizer step reads them
    first_opt = 4 * sw.n_s + 4 * sw.n_g
    assert e.first_step.read == first_opt + 3 * 2 * sw.n_r + 3 * 2 * 2 * fetched + 2 * 2 * sw.n_k
    # the field name DeepSpeed takes too (populate_by_name)
    q = apply_sets(
        get_preset("params_opt_nvme_1b_ga4"),
        {"ds.zero_optimization.param_persistence_threshold": 2048 * 2048},
    )
    assert estimate(q, ds_config(q)).swapped.n_k == sw.n_k
