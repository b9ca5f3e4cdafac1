import os
from pathlib import Path
from typing import Any

import pytest

from iotune import doctor
from iotune.checks import Check, Family, Status, check_block_tracepoint
from iotune.errors import NotRootError
from iotune.probes.sysfs import SysTree

DATA = Path(__file__).resolve().parent.parent / "data"


def tree_with(tmp_path: Path, files: dict[str, str]) -> SysTree:
    for rel, text in files.items():
        p = tmp_path / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return SysTree(tmp_path)


def test_tracefs_missing_fails_trace_with_the_mount_command(tmp_path: Path) -> None:
    c = doctor.check_tracefs(SysTree(tmp_path))
    assert c.status is Status.FAIL
    assert c.fix and "mount -t tracefs nodev /sys/kernel/tracing" in c.fix
    assert c.needed_by == {Family.TRACE}


def test_block_tracepoint_fields_from_a_recorded_format_file() -> None:
    # the format file of block:block_rq_issue recorded from the CI host's kernel
    c = check_block_tracepoint(SysTree(DATA / "ci-host"))
    assert c.status is Status.PASS, c.found


def test_block_tracepoint_without_bytes_field_fails(tmp_path: Path) -> None:
    fmt = (DATA / "ci-host/sys/kernel/tracing/events/block/block_rq_issue/format").read_text()
    old = "\n".join(line for line in fmt.splitlines() if " bytes;" not in line)
    t = tree_with(tmp_path, {"/sys/kernel/tracing/events/block/block_rq_issue/format": old})
    c = check_block_tracepoint(t)
    assert c.status is Status.FAIL
    assert "bytes" in c.found


def test_md_raid0_from_mdstat_modules_or_missing(tmp_path: Path) -> None:
    loaded = tree_with(tmp_path / "a", {"/proc/mdstat": "Personalities : [raid0] [raid1]\n"})
    assert doctor.check_md(loaded).status is Status.PASS
    import platform

    rel = platform.release()
    dep = tree_with(
        tmp_path / "b",
        {
            f"/lib/modules/{rel}/modules.dep": "kernel/drivers/md/raid0.ko.xz: kernel/drivers/md/md-mod.ko.xz\n"
        },
    )
    c = doctor.check_md(dep)
    assert c.status is Status.PASS and "modprobe raid0" in c.found
    none = doctor.check_md(SysTree(tmp_path / "c"))
    assert none.status is Status.FAIL and none.needed_by == {Family.RAID}


def test_torch_report_without_gpu_warns_and_aio_states() -> None:
    info: dict[str, Any] = {
        "torch": "2.13.0+cpu",
        "cuda": None,
        "gpus": [],
        "deepspeed": "0.19.8",
        "accelerator": "cpu",
        "aio": {"compatible": True, "built": False, "loaded": False},
    }
    checks = {c.name: c for c in doctor.checks_from_torch(info)}
    assert checks["GPU"].status is Status.WARN
    assert checks["DeepSpeed"].status is Status.PASS
    assert checks["async_io op"].status is Status.PASS
    assert "not built yet" in checks["async_io op"].found
    info["aio"] = {"compatible": True, "built": True, "loaded": False, "error": "CompileError: x"}
    failed = {c.name: c for c in doctor.checks_from_torch(info)}["async_io op"]
    assert failed.status is Status.FAIL and Family.SWEEP in failed.needed_by


def test_an_unreadable_op_build_directory_is_reported() -> None:
    info = {
        "torch": "2.13.0+cpu",
        "gpus": [],
        "deepspeed": "0.19.8",
        "aio": {"compatible": True, "built": False, "build_dir_error": "Permission denied: '/x'"},
    }
    checks = {c.name: c for c in doctor.checks_from_torch(info)}
    cache = checks["op cache"]
    assert cache.status is Status.WARN and "Permission denied: '/x'" in cache.found
    assert cache.fix and "TORCH_EXTENSIONS_DIR" in cache.fix
    info["aio"] = {"compatible": True, "built": False}
    assert "op cache" not in {c.name for c in doctor.checks_from_torch(info)}


def test_torch_missing_fails_train_and_sweep() -> None:
    checks = doctor.checks_from_torch({"torch": None})
    assert [c.name for c in checks] == ["torch"]
    assert checks[0].status is Status.FAIL
    assert {Family.TRAIN, Family.SWEEP} <= checks[0].needed_by


def test_gpu_is_described_with_memory() -> None:
    info = {
        "torch": "2.11",
        "cuda": "13.0",
        "deepspeed": None,
        "gpus": [{"name": "NVIDIA H100", "memory_bytes": 80 * 2**30}],
    }
    gpu = {c.name: c for c in doctor.checks_from_torch(info)}["GPU"]
    assert gpu.status is Status.PASS and "NVIDIA H100 (80.0 GiB)" in gpu.found


def test_ready_only_counts_failures_the_family_needs() -> None:
    checks = [
        Check("md raid0", Status.FAIL, "no", needed_by=frozenset({Family.RAID})),
        Check("GPU", Status.WARN, "none"),
        Check("bcc", Status.PASS, "ok", needed_by=frozenset({Family.TRACE})),
    ]
    assert [c.name for c in doctor.ready(checks, Family.RAID)] == ["md raid0"]
    assert doctor.ready(checks, Family.TRACE) == []


def test_memory_thresholds(tmp_path: Path) -> None:
    low = tree_with(
        tmp_path / "a", {"/proc/meminfo": "MemTotal: 4000000 kB\nMemAvailable: 3000000 kB\n"}
    )
    assert doctor.check_memory(low).status is Status.WARN
    high = tree_with(tmp_path / "b", {"/proc/meminfo": "MemAvailable: 30000000 kB\n"})
    c = doctor.check_memory(high)
    assert c.status is Status.PASS and "28.6 GiB" in c.found


def test_missing_names_the_failed_checks_per_family() -> None:
    checks = [
        Check("md raid0", Status.FAIL, "no", needed_by=frozenset({Family.RAID})),
        Check("torch", Status.FAIL, "no", needed_by=frozenset({Family.SWEEP, Family.TRAIN})),
        Check("bcc", Status.PASS, "ok", needed_by=frozenset({Family.TRACE})),
    ]
    assert doctor.missing(checks) == {
        "raid": ["md raid0"],
        "sweep": ["torch"],
        "trace": [],
        "train": ["torch"],
    }


def test_fix_mounts_tracefs_only_when_missing_and_only_as_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounted = tree_with(tmp_path / "a", {"/sys/kernel/tracing/events/README": ""})
    monkeypatch.setattr(doctor, "fix_tracefs", lambda: ["mount", "-t", "tracefs"])
    assert doctor.apply_fixes(mounted) == []
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert doctor.apply_fixes(SysTree(tmp_path / "b")) == ["mount -t tracefs"]
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NotRootError, match="iotune doctor --fix needs root"):
        doctor.apply_fixes(SysTree(tmp_path / "b"))


def test_bf16_check_names_the_flags_and_the_measured_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    (tmp_path / "proc").mkdir()
    info = tmp_path / "proc" / "cpuinfo"
    info.write_text("flags\t\t: sse2 avx avx2 fma\n")
    tree = SysTree(tmp_path)
    c = doctor.check_bf16(tree, {"cpu_bf16": {"bf16_cost": 48.2}})
    assert c.name == "bf16 (CPU)" and c.status is Status.PASS
    assert c.found.startswith("emulated: avx2, no avx512_bf16 or amx_bf16 in /proc/cpuinfo")
    assert "CPU presets train in float32" in c.found and "48.2x float32's time" in c.found
    info.write_text("flags\t\t: avx2 avx512f avx512_bf16 amx_bf16\n")
    c = doctor.check_bf16(tree, {"cpu_bf16": {"bf16_cost": 0.3}})
    assert c.found.startswith("native (avx512_bf16, amx_bf16): CPU presets train in bf16")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert "train in float32" in doctor.check_bf16(tree, {}).found
