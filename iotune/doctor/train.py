"""The doctor's checks of training: what the torch/DeepSpeed probe found (torch, CUDA, DeepSpeed
and its ops, transformers), and whether the CPU computes bf16 natively."""

from __future__ import annotations

from typing import Any

# the checks other commands make too live in iotune.checks; the doctor shows them all
from iotune.checks import (
    Check,
    Family,
    Status,
)
from iotune.probes.cpu import bf16_support
from iotune.probes.sysfs import SysTree
from iotune.units import GIB


def checks_from_torch(info: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    train = frozenset({Family.TRAIN})
    if info.get("worker_error"):
        out.append(
            Check(
                "torch",
                Status.FAIL,
                info["worker_error"],
                "run with --debug",
                train | {Family.SWEEP},
            )
        )
        return out
    if not info.get("torch"):
        out.append(
            Check(
                "torch",
                Status.FAIL,
                "not installed",
                "pip install 'iotune[train]' (scripts/setup.sh picks a CPU build on hosts "
                "without a GPU)",
                train | {Family.SWEEP},
            )
        )
        return out
    out.append(
        Check("torch", Status.PASS, f"torch {info['torch']}", needed_by=train | {Family.SWEEP})
    )
    gpus = info.get("gpus") or []
    if gpus:
        desc = "; ".join(f"{g['name']} ({g['memory_bytes'] / GIB:.1f} GiB)" for g in gpus)
        out.append(Check("GPU", Status.PASS, f"CUDA {info.get('cuda')}: {desc}"))
    else:
        out.append(
            Check(
                "GPU",
                Status.WARN,
                "no CUDA GPU visible to torch",
                "training runs use the CPU presets (tiny_*) with DS_ACCELERATOR=cpu",
            )
        )
    if not info.get("deepspeed"):
        out.append(
            Check(
                "DeepSpeed",
                Status.FAIL,
                info.get("deepspeed_error", "not installed"),
                "pip install 'iotune[train]'",
                train | {Family.SWEEP},
            )
        )
        return out
    out.append(
        Check(
            "DeepSpeed",
            Status.PASS,
            f"deepspeed {info['deepspeed']} (accelerator {info.get('accelerator')})",
            needed_by=train | {Family.SWEEP},
        )
    )
    aio = info.get("aio") or {}
    if aio.get("loaded"):
        out.append(
            Check("async_io op", Status.PASS, "built and loaded", needed_by=train | {Family.SWEEP})
        )
    elif aio.get("error"):
        out.append(
            Check(
                "async_io op",
                Status.FAIL,
                f"build/load failed: {aio['error']}",
                "install libaio-dev and a C++ compiler; run 'iotune --debug doctor --build-ops'",
                train | {Family.SWEEP},
            )
        )
    elif aio.get("compatible"):
        out.append(
            Check(
                "async_io op",
                Status.PASS,
                (
                    "buildable; built for another DeepSpeed install, so the first use rebuilds it"
                    if aio.get("stale")
                    else "buildable, not built yet"
                )
                + " (the first sweep or run JIT-builds it: a few minutes, once)",
                "iotune doctor --build-ops builds it now",
                train | {Family.SWEEP},
            )
        )
    else:
        out.append(
            Check(
                "async_io op",
                Status.FAIL,
                "DeepSpeed reports async_io incompatible with this host",
                "apt-get install libaio-dev g++",
                train | {Family.SWEEP},
            )
        )
    if aio.get("build_dir_error"):
        # without its build directory nothing says whether the op is cached: the first run
        # may build it (minutes), or fail to write the build
        out.append(
            Check(
                "op cache",
                Status.WARN,
                f"cannot inspect the op build directory: {aio['build_dir_error']}",
                "set TORCH_EXTENSIONS_DIR to a writable directory, or run "
                "'iotune doctor --build-ops'",
                train | {Family.SWEEP},
            )
        )
    return out


def check_bf16(tree: SysTree, info: dict[str, Any]) -> Check:
    """Does the CPU compute bf16 natively? The CPU presets train in bf16 where it does and in
    float32 where it is emulated (about 50x slower); the cost torch measured is shown."""
    cpu = bf16_support(tree)
    seen = info.get("cpu_bf16") or {}
    cost = seen.get("bf16_cost")
    measured = f"; a bf16 matmul + backward took {cost}x float32's time" if cost else ""
    if cpu.native:
        return Check("bf16 (CPU)", Status.PASS, f"{cpu.why}: CPU presets train in bf16{measured}")
    return Check(
        "bf16 (CPU)",
        Status.PASS,
        f"{cpu.why}: CPU presets train in float32 (bf16 is emulated here{measured})",
        "forcing it (--set dtype=bf16) is allowed, at that cost",
    )
