"""Worker: report torch, CUDA/GPU, DeepSpeed and its async_io op as one JSON object on stdout.

Run as ``python -m iotune.workers.torch_probe [--build]``. With ``--build`` the async_io op
is loaded even when that means a JIT build (minutes the first time, cached afterwards).
``--prepare --ops NAME,...`` (with ``--accelerator``) loads exactly the named op builders of
the accelerator a training run will use, building what is not cached, reports each, and
reads the code a training worker runs into the page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from iotune.workers import cpu_info_once, private_stdout
from iotune.workers.built_ops import built, free_stale_lock


def _gpu_numa(props: Any) -> int | None:
    """The NUMA node of a GPU's PCI device (sysfs), None where the kernel does not know."""
    try:
        addr = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        with open(f"/sys/bus/pci/devices/{addr}/numa_node") as fh:
            node = int(fh.read().strip())
    except (AttributeError, OSError, ValueError):
        return None
    return node if node >= 0 else None


def cpu_bf16(torch: Any, measure: bool = True) -> dict[str, Any]:
    """torch's own view of bf16 on this CPU (oneDNN's native bf16, ATen's vector level) and,
    with *measure*, what bf16 costs here: a Linear layer's forward and backward at a tiny
    Llama's width (512 tokens x 512 -> 1536), best of three, bf16 time over float32 time
    (below 1 where bf16 is native, about 50 on an AVX2 host)."""
    out: dict[str, Any] = {"cpu_capability": None, "mkldnn_bf16": None}
    try:
        out["cpu_capability"] = str(torch.backends.cpu.get_cpu_capability())
        out["mkldnn_bf16"] = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        pass  # an older torch: the cpuinfo flags answer alone
    if not measure:
        return out
    times = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        x = torch.randn(512, 512, dtype=dt, requires_grad=True)
        w = torch.randn(1536, 512, dtype=dt, requires_grad=True)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            torch.nn.functional.linear(x, w).sum().backward()
            best = min(best, time.perf_counter() - t0)
        times[name] = best
    out["linear_s"] = {k: round(v, 6) for k, v in times.items()}
    out["bf16_cost"] = round(times["bf16"] / max(times["fp32"], 1e-9), 2)
    return out


def probe(build: bool, bf16_cost: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"torch": None, "cuda": None, "gpus": [], "deepspeed": None, "aio": None}
    try:
        import torch
    except ImportError as exc:
        out["torch_error"] = str(exc)
        return out
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    # timing emulated bf16 takes seconds on an AVX2 host, minutes in an emulated guest: only
    # doctor asks what it costs
    out["cpu_bf16"] = cpu_bf16(torch, measure=bf16_cost)
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out["gpus"].append(
                {
                    "index": i,
                    "name": p.name,
                    "memory_bytes": int(p.total_memory),
                    "numa_node": _gpu_numa(p),
                }
            )
    else:
        # DeepSpeed runs on a CPU-only torch with its cpu accelerator (gloo backend)
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
        from deepspeed.ops.op_builder import AsyncIOBuilder
    except Exception as exc:  # noqa: BLE001 - any failure here is the answer, reported
        out["deepspeed_error"] = f"{type(exc).__name__}: {exc}"
        return out
    out["deepspeed"] = deepspeed.__version__
    out["accelerator"] = os.environ.get("DS_ACCELERATOR") or "auto"
    aio: dict[str, Any] = {"compatible": False, "built": False, "loaded": False}
    builder = AsyncIOBuilder()
    aio["compatible"] = bool(builder.is_compatible(verbose=False))
    try:
        aio.update(built(builder))
    except Exception as exc:  # noqa: BLE001 - any failure here is the answer, reported
        aio["build_dir_error"] = str(exc)
    if aio["compatible"] and (aio["built"] or build):
        try:
            if aio.get("build_dir"):
                aio["lock"] = free_stale_lock(aio["build_dir"])
            builder.load(verbose=False)
            aio["loaded"] = True
            aio["built"] = True
        except Exception as exc:  # noqa: BLE001 - any failure here is the answer, reported
            aio["error"] = f"{type(exc).__name__}: {exc}"[-500:]
    out["aio"] = aio
    return out


def load_ops(names: list[str], warm: bool = True) -> dict[str, Any]:
    """Load each op builder by class name the way the run will (through the accelerator's own
    builders), building it if its cache is cold; an op the accelerator lacks or cannot build
    is reported as such, not raised."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    out: dict[str, Any] = {"accelerator": acc.device_name(), "ops": {}}
    for name in names:
        entry: dict[str, Any] = {"loaded": False}
        builder = acc.create_op_builder(name)
        # loaded already: by the zygote this worker forked from (DeepSpeed's own cache). Such
        # an op is compatible: asking again compiles and links a test program (async_io's
        # libaio check), seconds of a worker on an emulated CPU
        cached = builder is not None and builder.name in type(builder)._loaded_ops
        if builder is None:
            entry["skipped"] = "not an op of this accelerator"
        elif not cached and not builder.is_compatible(verbose=False):
            entry["skipped"] = "not compatible with this host"
        else:
            entry["cached"] = cached
            t0 = time.monotonic()
            try:
                entry["lock"] = free_stale_lock(built(builder)["build_dir"])
                builder.load(verbose=False)
                entry["loaded"] = True
            except Exception as exc:  # noqa: BLE001 - reported per op, the run decides
                entry["error"] = f"{type(exc).__name__}: {exc}"[-500:]
            entry["seconds"] = round(time.monotonic() - t0, 3)
        out["ops"][name] = entry
    # DeepSpeed's table of the ops this host can build, kept from the zygote this worker
    # forked from (False: the worker's communication backend works it out as it starts)
    ops_module = sys.modules.get("deepspeed.ops")
    out["ops_table_kept"] = ops_module is not None and "__compatible_ops__" in vars(ops_module)
    out["warmed"] = warm_code() if warm else None
    return out


#: the packages a training worker runs code from (the nvidia-* wheels hold CUDA's libraries)
CODE_PACKAGES = ("torch", "deepspeed", "transformers", "nvidia", "triton", "numpy", "safetensors")


def code_roots(ext: str | None) -> list[str]:
    """The folders a training worker runs code from: its packages and the op cache *ext*.
    Found without importing them."""
    import importlib.util

    roots = []
    for name in CODE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.extend(spec.submodule_search_locations)
    if ext:
        roots.append(ext)
    return list(dict.fromkeys(roots))


def warm_code() -> dict[str, Any]:
    """Read every file of the packages the training worker runs, and of the op cache, into
    the page cache. A process pages its code in as it first executes it (libtorch's kernels,
    cuBLAS on the first matmul, lazily imported modules): on a cold host those reads would
    land on the traced drive during the first steps and read as the training's I/O."""
    t0 = time.monotonic()
    files = total = 0
    buf = bytearray(8 << 20)
    for root in code_roots(os.environ.get("TORCH_EXTENSIONS_DIR")):
        for dirpath, _dirs, names in os.walk(root):
            for n in names:
                try:
                    with open(os.path.join(dirpath, n), "rb", buffering=0) as fh:
                        while got := fh.readinto(buf):
                            total += got
                except OSError:
                    continue  # a socket, a file removed meanwhile: nothing to warm
                files += 1
    return {"files": files, "bytes": total, "seconds": round(time.monotonic() - t0, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    cpu_info_once()
    parser.add_argument("--build", action="store_true")
    parser.add_argument("--bf16-cost", action="store_true", help="time bf16 against float32")
    parser.add_argument("--prepare", action="store_true", help="load --ops, warm the code")
    parser.add_argument("--ops", default="")
    parser.add_argument("--no-warm", action="store_true", help="the code is on no traced drive")
    parser.add_argument("--accelerator")
    parser.add_argument("--bf16", action="store_true", help="only what bf16 costs on this CPU")
    args = parser.parse_args()
    report = private_stdout()
    if args.bf16:
        import torch

        result = cpu_bf16(torch)
    elif args.prepare:
        if args.accelerator:
            os.environ.setdefault("DS_ACCELERATOR", args.accelerator)
        result = load_ops([n for n in args.ops.split(",") if n], warm=not args.no_warm)
    else:
        result = probe(args.build, args.bf16_cost)
    report.write(json.dumps(result) + "\n")
    report.flush()


if __name__ == "__main__":
    main()
