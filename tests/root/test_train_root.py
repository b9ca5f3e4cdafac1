"""Root tier: real DeepSpeed ZeRO-3 training steps on CPU (DS_ACCELERATOR=cpu) swapping to an
ext4 filesystem on a loop device, traced by the real eBPF program, checked against the
kernel's counters and against `iotune estimate`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from iotune.probes.cpu import bf16_support
from tests.io_rules import param_reads_shift_ok
from tests.root.conftest import (
    IOTUNE,
    PLAIN,
    LoopDevices,
    interrupt_after_steps,
    iotune,
    iotune_json,
)

#: each step of a traced run waits at its event until the tracer has sampled it
pytestmark = pytest.mark.beside_study

MIB = 1 << 20


def _offload_dir(loop_device: Callable[..., str], size_mib: int = 2048) -> tuple[str, Path]:
    dev = loop_device(size_mib=size_mib, fs="ext4", mount=True)
    mnt = loop_device.mounts[-1]  # type: ignore[attr-defined]
    # DeepSpeed issues block_size (512 KiB) requests; a loop device may merge two of them
    # (its max_sectors_kb is 1280), an NVMe drive's limit is typically 512 KiB or less
    Path(f"/sys/block/{Path(dev).name}/queue/max_sectors_kb").write_text("512")
    return Path(dev).name, mnt


def _within(measured: float, predicted: float, tol: float) -> bool:
    return abs(measured - predicted) <= tol * predicted


def _row(doc: dict[str, Any], case: str) -> dict[str, Any]:
    return next(r for r in doc["table"] + doc["estimate_table"] if r["case"].startswith(case))


@pytest.fixture(scope="module")
def tiny_opt_nvme_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One traced run shared by the checks below (DeepSpeed's start-up costs ~15 s)."""
    devs = LoopDevices(tmp_path_factory.mktemp("train"))
    try:
        dev, mnt = _offload_dir(devs)
        out = devs.tmp / "run"
        p = iotune(
            "--json",
            "trace",
            "--run",
            "tiny_opt_nvme",
            "--nvme-path",
            str(mnt),
            "--steps",
            "3",
            "--out",
            str(out),
            env=PLAIN,  # its peak RSS is checked against the estimate
        )
        doc: dict[str, Any] = json.loads(p.stdout)
        doc["_dev"] = dev
        doc["_mnt"] = str(mnt)
        doc["_estimate_cli"] = iotune_json("estimate", "tiny_opt_nvme")
        doc["_left"] = sorted(x.name for x in mnt.iterdir() if x.name != "lost+found")
        return doc
    finally:
        devs.close()


def test_traced_run_produces_the_study_table(tiny_opt_nvme_run: dict[str, Any]) -> None:
    doc = tiny_opt_nvme_run
    assert doc["exit_code"] == 0 and doc["interrupted"] is None
    assert doc["steps_done"] == 3 and doc["drives"] == [doc["_dev"]]
    # auto: the libbpf tracer on this BTF kernel
    assert doc["backend"] == "libbpf" and doc["focus_size"] == 512 * 1024
    cases = [r["case"] for r in doc["table"]]
    assert cases == ["init + first step", "steady step (median of 2)"]
    for r in doc["table"]:
        assert r["step_s"] > 0 and 0 < r["optimizer_s"] <= r["step_s"]
        assert r["read_gib"] > 0 and r["write_gib"] > 0 and r["nvme_gib"] > 0
    steps = [e for e in doc["events"] if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3]
    for e in steps:
        assert e["forward_s"] > 0 and e["backward_s"] > 0 and e["tokens_per_s"] > 0
        assert 9.0 < e["loss"] < 12.0  # ln(32000) = 10.4 for an untrained model
        assert e["host_rss_bytes"] > 100 * MIB
    out = Path(doc["out"])
    for f in (
        "run.json",
        "result.csv",
        "result.md",
        "steps.jsonl",
        "trace.json",
        "samples.jsonl",
        "ds_config.json",
    ):
        assert (out / f).is_file(), f
    assert "| tiny_opt_nvme: init + first step |" in (out / "result.md").read_text()
    # the swap files are removed after the run, nothing else is left on the volume
    assert doc["_left"] == []


def test_traced_bytes_equal_diskstats(tiny_opt_nvme_run: dict[str, Any]) -> None:
    doc = tiny_opt_nvme_run
    trace = json.loads((Path(doc["out"]) / "trace.json").read_text())
    (d,) = [d for d in trace["devices"] if d["name"] == doc["_dev"]]
    ks = d["diskstats"]
    for op in ("read", "write"):
        assert ks[f"{op}_bytes"] > 100 * MIB
        assert _within(d[op]["bytes"], ks[f"{op}_bytes"], 0.01), (op, d[op]["bytes"], ks)
    assert doc["diskstats_check"][0]["device"] == doc["_dev"]
    # and per step: every step's traced bytes against the kernel's counter delta
    for s in doc["io_steps"]:
        for op in ("read", "write"):
            assert (
                _within(s[op]["bytes"], s[op]["diskstats_bytes"], 0.01)
                or s[op]["diskstats_bytes"] == 0
            )


def test_requests_are_mostly_the_aio_block_size(tiny_opt_nvme_run: dict[str, Any]) -> None:
    for r in tiny_opt_nvme_run["table"]:
        for op in ("read", "write"):
            focus, other = r[f"{op}_focus"], r[f"{op}_other"]
            assert focus > 0
            assert focus / (focus + other) >= 0.95, (r["case"], op, focus, other)


#: what writes move beyond DeepSpeed's files: ext4's journal commits and metadata blocks
#: (6 KiB to 90 KiB a step measured)
FS_WRITES = 256 * 1024


def _swap_files_bytes(doc: dict[str, Any]) -> int:
    """The swap folder's file sizes at the last step (what DeepSpeed wrote, not allocated)."""
    return int(max(e["swap"]["apparent"] for e in doc["events"] if e.get("swap")))


def test_footprint_and_volumes_match_the_estimate(tiny_opt_nvme_run: dict[str, Any]) -> None:
    """To the byte: DeepSpeed's files and every read; writes up to the filesystem's own."""
    doc = tiny_opt_nvme_run
    est = doc["_estimate_cli"]
    assert est["nvme_bytes"] == doc["footprint"]["estimate"] == _swap_files_bytes(doc)
    assert _within(doc["footprint"]["allocated"], est["nvme_bytes"], 0.05)
    first, steady = _row(doc, "init + first"), _row(doc, "steady")
    assert first["read_bytes"] == est["init_first"]["read"]
    assert 0 <= first["write_bytes"] - est["init_first"]["write"] <= FS_WRITES
    for s in doc["io_steps"][2:]:  # every steady step
        assert s["read"]["bytes"] == est["steady_step"]["read"], s["label"]
        assert 0 <= s["write"]["bytes"] - est["steady_step"]["write"] <= FS_WRITES, s["label"]
    # the model's shape: init + first step moves 12N/24N, a steady step 16N each way
    n = est["params"]
    assert 11.5 < first["read_bytes"] / n < 12.5 and 23 < first["write_bytes"] / n < 25
    assert 15.5 < steady["read_bytes"] / n < 16.5 and 15.5 < steady["write_bytes"] / n < 16.5
    _peak_rss_matches_the_estimate(doc)


def test_preflight_refuses_with_numbers(loop_device: Callable[..., str], tmp_path: Path) -> None:
    _, mnt = _offload_dir(loop_device, size_mib=256)
    p = iotune(
        "run", "opt_nvme_16b", "--nvme-path", str(mnt), "--set", "accelerator=cpu", check=False
    )
    assert p.returncode == 1, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in p.stderr
    assert lines[0].startswith("iotune: error: opt_nvme_16b needs ≈ 244.8 GiB free at ")
    assert "found 0.2 GiB" in lines[0]
    est = iotune_json("estimate", "opt_nvme_16b", "--set", "accelerator=cpu")
    from iotune.probes.meminfo import mem_available

    # the RAM shortfall is named too, on a host with less than the estimate
    assert ("of host RAM" in lines[0]) == (est["host_bytes"] > mem_available())
    assert lines[1].startswith("hint: ") and "--force" in lines[1]
    assert list(mnt.iterdir()) == [mnt / "lost+found"]  # nothing was allocated


def test_kill_mid_run_keeps_step_records_and_trace(
    loop_device: Callable[..., str], tmp_path: Path, plain_workers: None
) -> None:
    _, mnt = _offload_dir(loop_device)
    out = tmp_path / "run"
    child = subprocess.Popen(
        [
            IOTUNE,
            "trace",
            "--run",
            "tiny_opt_nvme",
            "--nvme-path",
            str(mnt),
            "--steps",
            "500",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr = interrupt_after_steps(child, out / "steps.jsonl", 2)
    assert (
        "interrupted (SIGINT) after" in stderr
        and "Traceback" not in stderr.split("iotune: running")[-1]
    )
    doc = json.loads((out / "run.json").read_text())
    assert doc["interrupted"] == "SIGINT" and doc["steps_done"] >= 2
    assert next(r["case"] for r in doc["table"]) == "init + first step"
    trace = json.loads((out / "trace.json").read_text())
    assert trace["interrupted"] == "SIGINT" and trace["steps"]
    assert len((out / "samples.jsonl").read_text().splitlines()) >= 4
    assert [x.name for x in mnt.iterdir()] == ["lost+found"]  # swap files removed


#: how long the tracer is stopped: several of tiny_opt_nvme's steps (about a second each)
STOPPED_S = 6.0


def test_a_stopped_tracer_holds_the_run_at_its_event(
    loop_device: Callable[..., str], tmp_path: Path
) -> None:
    """The tracer takes a step's counts when it reads the step's event, and the worker
    waits there until it has (iotune/trace/acks.py). A tracer stopped (SIGSTOP) right after
    the init event, as a host whose CPU is busy delays it, holds the run: no more than the
    step in flight ends meanwhile, and every step still moves the I/O model's bytes, none
    of them counted in the step before."""
    _, mnt = _offload_dir(loop_device)
    out = tmp_path / "run"
    child = subprocess.Popen(
        [
            *(IOTUNE, "--json", "trace", "--run", "tiny_opt_nvme"),
            *("--nvme-path", str(mnt), "--steps", "4", "--out", str(out)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    steps = out / "steps.jsonl"
    deadline = time.monotonic() + 300
    while not (steps.exists() and '"event": "init"' in steps.read_text()):
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "no init event"
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGSTOP)
    try:
        time.sleep(STOPPED_S)  # what a worker that did not wait would use to run on
        held = steps.read_text().count('"event": "step"')
    finally:
        os.kill(child.pid, signal.SIGCONT)
    stdout, stderr = child.communicate(timeout=300)
    assert child.returncode == 0, stderr[-3000:]
    assert held <= 1, held
    doc = json.loads(stdout)
    est = doc["estimate"]["steady_step"]
    assert [s["label"] for s in doc["io_steps"]] == ["init:0", *(f"step:{i}" for i in (1, 2, 3, 4))]
    for s in doc["io_steps"][2:]:
        assert s["read"]["bytes"] == est["read"], s["label"]
        assert 0 <= s["write"]["bytes"] - est["write"] <= FS_WRITES, s["label"]


def test_the_run_says_which_dtype_ran_and_why(tiny_opt_nvme_run: dict[str, Any]) -> None:
    """bf16 where this CPU computes it natively, float32 where it would be emulated."""
    doc = tiny_opt_nvme_run
    cpu = bf16_support()
    want = "bf16" if cpu.native else "fp32"
    assert doc["dtype"]["name"] == want and doc["dtype"]["native_bf16"] is cpu.native
    assert cpu.why in doc["dtype"]["why"]
    cfg = json.loads((Path(doc["out"]) / "ds_config.json").read_text())
    assert cfg["bf16"]["enabled"] is cpu.native
    # the worker computed in it, and torch agrees with the cpuinfo flags
    ready = json.loads((Path(doc["out"]) / "steps.jsonl").read_text().splitlines()[0])
    assert ready["event"] == "ready" and ready["dtype"] == want
    assert ready["cpu"]["mkldnn_bf16"] is cpu.native


def test_forced_bf16_on_an_emulating_cpu_warns_with_the_measured_cost(tmp_path: Path) -> None:
    """oneDNN capped at AVX2 emulates bf16 on any CPU: the run goes on, warned, with the cost
    torch measured here (16-token steps keep the emulated backward short)."""
    out = tmp_path / "r"
    sets = ["--set", "dtype=bf16", "--set", "seq_len=16"]
    p = iotune(
        "run",
        "tiny_opt_ram",
        *sets,
        "--steps",
        "1",
        "--out",
        str(out),
        env={"ONEDNN_MAX_CPU_ISA": "AVX2"},
    )
    # the run's header says which dtype runs and why
    assert "dtype     bf16: set with --set dtype=bf16; bf16 here is emulated" in p.stderr
    (warning,) = [x for x in p.stderr.splitlines() if "float32's time" in x]
    # the reason: the CPU's own flags where it lacks bf16, else the oneDNN cap
    flags = Path("/proc/cpuinfo").read_text()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    why = "ONEDNN_MAX_CPU_ISA=AVX2" if native else "no avx512_bf16 or amx_bf16 in /proc/cpuinfo"
    assert warning.startswith("iotune: warning: bf16 is emulated: ") and why in warning
    cost = float(warning.split("takes ")[1].split("x float32")[0])
    assert cost > 2, warning  # emulated: several times float32 (~30-50x measured)
    doc = json.loads((out / "run.json").read_text())
    assert doc["dtype"]["name"] == "bf16" and doc["dtype"]["native_bf16"] is False
    assert any("float32's time" in n for n in doc["notes"])
    # its worker came from the tier's zygote, and the host-RAM line says what that leaves out
    assert doc["host_ram"]["forked"] is True
    (ram,) = [x for x in p.stdout.splitlines() if x.startswith("host RAM: ")]
    assert ram.endswith(
        "; the worker was forked from a zygote: its RSS leaves out the imported pages it "
        "has not touched"
    )


def test_params_offload_runs_with_sized_buffers(
    loop_device: Callable[..., str], tmp_path: Path, plain_workers: None
) -> None:
    _dev, mnt = _offload_dir(loop_device)
    doc = iotune_json(
        "trace",
        "--run",
        "tiny_params_opt_nvme",
        "--set",
        "dtype=fp32",
        "--nvme-path",
        str(mnt),
        "--steps",
        "4",
        "--out",
        str(tmp_path / "r"),
    )
    assert doc["exit_code"] == 0 and doc["steps_done"] == 4
    cfg = json.loads((tmp_path / "r" / "ds_config.json").read_text())
    op = cfg["zero_optimization"]["offload_param"]
    assert op["device"] == "nvme" and op["buffer_count"] == 24 and op["max_in_cpu"] == 0
    assert cfg["bf16"]["enabled"] is False
    est = doc["estimate"]
    # float32 parameter files (4 bytes an element, q_proj and o_proj over the 1 MiB minimum
    # too) join the optimizer's: DeepSpeed's files are the model's, to the byte
    assert est["swapped"]["n_p"] == 4 * 3 * 512 * 1536 + 4 * 2 * 512 * 512 + 32000 * 512
    assert _swap_files_bytes(doc) == est["nvme_bytes"]
    pred = est["steady_step"]
    fetch = 4 * est["swapped"]["n_p"]  # one read of every parameter file
    steady = doc["io_steps"][2:]
    for s in steady:
        assert 0 <= s["write"]["bytes"] - pred["write"] <= FS_WRITES, s["label"]
        # give or take whole parameter files (the embedding's is 62.5 MiB)
        off = s["read"]["bytes"] - pred["read"]
        assert param_reads_shift_ok(off, est["swapped"]["n_p"]), (s["label"], off)
    # over the steady steps the shifts cancel but for what crossed the first or last boundary
    total = sum(s["read"]["bytes"] for s in steady)
    assert abs(total - len(steady) * pred["read"]) <= fetch
    row = _row(doc, "steady")
    for op_ in ("read", "write"):
        assert row[f"{op_}_focus"] / (row[f"{op_}_focus"] + row[f"{op_}_other"]) >= 0.95
    _peak_rss_matches_the_estimate(doc)


def _peak_rss_matches_the_estimate(doc: dict[str, Any]) -> None:
    """Peak RSS (VmHWM, what an OOM kill sees) within 10% of the host-RAM estimate, for a
    plain worker: one forked from a zygote leaves out of its RSS the library pages the
    zygote's imports touched (fp32 here: 0.88x the estimate from the zygote, 0.94x plain)."""
    ram = doc["host_ram"]
    assert ram["forked"] is False
    assert ram["measured_peak"] and ram["estimate_peak"] == doc["estimate"]["host_bytes"]
    assert 0.9 <= ram["measured_peak"] / ram["estimate_peak"] <= 1.1, ram


def test_ram_offload_run_touches_no_drive(tmp_path: Path, plain_workers: None) -> None:
    doc = iotune_json("run", "tiny_opt_ram", "--steps", "2", "--out", str(tmp_path / "r"))
    assert doc["exit_code"] == 0 and doc["steps_done"] == 2
    assert doc["drives"] == [] and doc["nvme_path"] is None and doc["footprint"] is None
    cfg = json.loads((tmp_path / "r" / "ds_config.json").read_text())
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "aio" not in cfg
    first = _row(doc, "init + first")
    assert first["step_s"] > 0 and first["read_gib"] is None
    _peak_rss_matches_the_estimate(doc)


def test_a_ram_optimizers_resume_says_nothing_of_swap_files(tmp_path: Path) -> None:
    """With the optimizer in host RAM DeepSpeed loads its state itself: the resumed run's
    step is the saving run's, nothing is put back by iotune (adam_restored None), and no
    note speaks of swap files copied back or of a resume's I/O."""
    ck = tmp_path / "ck"
    iotune_json("run", "tiny_opt_ram", "--steps", "2", "--checkpoint-every", "1",
                "--checkpoint-dir", str(ck), "--out", str(tmp_path / "s"))  # fmt: skip
    doc = iotune_json("run", "tiny_opt_ram", "--steps", "1", "--resume-from", str(ck / "step1"),
                      "--out", str(tmp_path / "r"))  # fmt: skip
    assert doc["exit_code"] == 0 and doc["resumed_at"] == 1
    assert doc["resume_check"]["ok"] is True and doc["resume_check"]["rel_diff"] == 0.0
    init = next(e for e in doc["events"] if e["event"] == "init")
    assert init["adam_restored"] is None and init["resume_copy"] == []
    notes = [n for n in doc["notes"] if n.startswith("resumed")]
    assert len(notes) == 1 and notes[0].startswith("resumed: step 2's loss"), doc["notes"]


def test_every_strategy_config_is_read_by_deepspeed(tmp_path: Path) -> None:
    """DeepSpeed's own readers (get_aio_config, DeepSpeedZeroConfig with ZenFlow) accept the
    generated config of every strategy, and read the aio block as written."""
    import sys

    from iotune.model.dsconfig import ds_config
    from iotune.model.presets import get_preset, load_presets

    strategies = sorted({p.strategy.name for p in load_presets().values()})
    assert len(strategies) == 9
    names = [f"{s}_1b" for s in strategies] + ["tiny_params_opt_nvme"]
    cfgs = {n: ds_config(get_preset(n)) for n in names}
    (tmp_path / "cfgs.json").write_text(json.dumps(cfgs))
    code = (
        "import json, sys; from iotune.workers.ds_config_check import check; "
        "cfgs = json.load(open(sys.argv[1])); "
        "print(json.dumps({n: check(c) for n, c in cfgs.items()}))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "cfgs.json")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    reports = json.loads(p.stdout.strip().splitlines()[-1])
    for n, rep in reports.items():
        assert rep["errors"] == [], (n, rep["errors"])
        # every offload strategy runs ZeRO stage 3, the ZenFlow ones too
        want = 0 if n.startswith("gpu_baseline") else 3
        assert rep["zero_stage"] == want, n
        if "aio" in cfgs[n]:
            assert rep["aio_used"] == cfgs[n]["aio"], n


def test_accumulation_adds_no_nvme_io(loop_device: Callable[..., str], tmp_path: Path) -> None:
    """Micro-steps accumulate gradients in RAM: with ga=2 a steady step still moves 16N."""
    _, mnt = _offload_dir(loop_device)
    doc = iotune_json(
        "trace",
        "--run",
        "tiny_opt_nvme",
        "--nvme-path",
        str(mnt),
        "--steps",
        "2",
        "--set",
        "ga=2",
        "--out",
        str(tmp_path / "r"),
    )
    assert doc["exit_code"] == 0 and doc["ga"] == 2
    steps = [e for e in doc["events"] if e["event"] == "step"]
    assert all(e["accumulate_s"] > 0 for e in steps)
    assert steps[0]["tokens_per_s"] * steps[0]["step_s"] == pytest.approx(2 * 512, rel=0.01)
    steady, pred = _row(doc, "steady"), doc["estimate"]["steady_step"]
    assert _within(steady["read_bytes"], pred["read"], 0.05)
    assert _within(steady["write_bytes"], pred["write"], 0.05)


def test_raid_preset_needs_a_raid0_volume(loop_device: Callable[..., str]) -> None:
    dev, mnt = _offload_dir(loop_device, size_mib=256)
    p = iotune(
        "run", "opt_raid0_1b", "--nvme-path", str(mnt), "--set", "accelerator=cpu", check=False
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr
    first, hint = p.stderr.strip().splitlines()[-2:]
    assert f"expects a RAID0 volume at {mnt}, which is on {dev}" in first
    assert hint.startswith("hint: ") and "iotune raid create" in hint
