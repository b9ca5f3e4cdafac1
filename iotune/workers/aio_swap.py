"""Worker: DeepSpeed's optimizer swapping for one preset, rehearsed with the real async_io op.

    python -m iotune.workers.aio_swap '<json>'

The JSON names the target directory, the aio block (block_size, queue_depth, threads,
single_submit, overlap_events), ``layout`` (per optimizer sub-group: the elements of its
fp32 master and of each Adam moment, and of each gradient swapped; iotune.model.swapfiles.
swap_layout) and ``rounds``. The files and their order are those of DeepSpeed's
PartitionedOptimizerSwapper (runtime/swap_tensor/partitioned_optimizer_swapper.py):

* once, as the engine's initialisation does: every sub-group's master and moments written;
* each round, as one step does: every swapped gradient written, one file per parameter
  (backward); then per sub-group: its three state tensors read (``async_pread`` each, one
  ``wait``), its gradients read (one ``wait``), and the three state tensors written back
  (one ``wait``). With ``adam``, DeepSpeed's CPU Adam updates the sub-group in between, as
  in the step; without, nothing does.

Sizes are aligned as DeepSpeed aligns them (1 KiB x threads). Buffers are pinned with
``new_cpu_locked_tensor`` and filled with random values once. Prints one JSON object on
the original stdout: the bytes and seconds of each phase per round. The files are removed
on every exit path.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import time
from typing import Any

from iotune.workers import private_stdout

DIR_PREFIX = "iotune-swap-"
ALIGN_BYTES = 1024  # DeepSpeed's AIO_ALIGNED_BYTES, times intra_op_parallelism
FP32 = 4


def aligned(numel: int, threads: int) -> int:
    unit = ALIGN_BYTES * threads // FP32
    return -(-numel // unit) * unit


def rehearse(p: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder

    threads = int(p["threads"])
    handle = (
        AsyncIOBuilder()
        .load(verbose=False)
        .aio_handle(
            int(p["block_size"]),
            int(p["queue_depth"]),
            bool(p["single_submit"]),
            bool(p["overlap_events"]),
            threads,
        )
    )
    layout = [(int(s), [int(g) for g in grads]) for s, grads in p["layout"]]
    largest = max(
        [aligned(s, threads) for s, _ in layout]
        + [sum(aligned(g, threads) for g in gs) for _, gs in layout]
    )
    folder = os.path.join(p["target"], f"{DIR_PREFIX}{os.getpid()}")
    os.makedirs(folder)
    example = torch.empty(0, dtype=torch.float32)
    # the master, two moments and the gradients of the sub-group in flight, as DeepSpeed
    buffers = [handle.new_cpu_locked_tensor(largest, example) for _ in range(4)]
    try:
        for b in buffers:
            b.normal_()

        adam = None
        if p.get("adam"):
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            adam = DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(1))], lr=1e-4)

        def adam_step(numel: int) -> None:
            """DeepSpeed's CPU Adam on the sub-group in the buffers, as the step does
            between its reads and its writes."""
            if adam is None or not numel:
                return
            param = torch.nn.Parameter(buffers[0].narrow(0, 0, numel))
            param.grad = buffers[3].narrow(0, 0, numel)
            adam.param_groups[0]["params"] = [param]
            adam.state[param] = {
                "step": 1,
                "exp_avg": buffers[1].narrow(0, 0, numel),
                "exp_avg_sq": buffers[2].narrow(0, 0, numel).abs_(),
            }
            adam.step()
            del adam.state[param]

        def state_paths(g: int) -> list[str]:
            return [
                os.path.join(folder, f"g{g}-{t}.swp") for t in ("param", "exp_avg", "exp_avg_sq")
            ]

        def grad_paths(g: int, n: int) -> list[str]:
            return [os.path.join(folder, f"g{g}-grad{i}.swp") for i in range(n)]

        def grads_io(submit: Any, g: int, grads: list[int], what: str) -> None:
            """Every gradient of sub-group ``g`` through ``submit`` (async_pread or
            async_pwrite) into or out of the gradient buffer, then one wait."""
            off = 0
            for n, path in zip(grads, grad_paths(g, len(grads)), strict=True):
                submit(buffers[3].narrow(0, off, aligned(n, threads)), path)
                off += aligned(n, threads)
            if grads and handle.wait() != len(grads):
                raise RuntimeError(f"a gradient {what} did not complete")

        def state_io(submit: Any, g: int, numel: int, what: str) -> None:
            """The master and both moments of sub-group ``g`` through ``submit`` into or out
            of their buffers, then one wait (nothing for a sub-group that stays in RAM)."""
            if not numel:
                return
            n = aligned(numel, threads)
            for b, path in zip(buffers[:3], state_paths(g), strict=True):
                submit(b.narrow(0, 0, n), path)
            if handle.wait() != 3:
                raise RuntimeError(f"a state {what} did not complete")

        t0 = time.perf_counter()
        for g, (numel, _) in enumerate(layout):
            state_io(handle.async_pwrite, g, numel, "write")
        init_s = time.perf_counter() - t0
        state_bytes = sum(3 * FP32 * aligned(s, threads) for s, _ in layout)
        grad_bytes = sum(FP32 * aligned(n, threads) for _, gs in layout for n in gs)
        rounds = []
        for _ in range(int(p["rounds"])):
            t0 = time.perf_counter()
            for g, (_, grads) in enumerate(layout):
                grads_io(handle.async_pwrite, g, grads, "write")
            grad_write_s = time.perf_counter() - t0
            read_s = write_s = adam_s = 0.0
            for g, (numel, grads) in enumerate(layout):
                t0 = time.perf_counter()
                state_io(handle.async_pread, g, numel, "read")
                grads_io(handle.async_pread, g, grads, "read")
                t1 = time.perf_counter()
                adam_step(numel)
                t2 = time.perf_counter()
                state_io(handle.async_pwrite, g, numel, "write")
                read_s += t1 - t0
                adam_s += t2 - t1
                write_s += time.perf_counter() - t2
            rounds.append(
                {
                    "grad_write_s": grad_write_s,
                    "read_s": read_s,
                    "adam_s": adam_s,
                    "write_s": write_s,
                }
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        for b in buffers:
            handle.free_cpu_locked_tensor(b)
    read_bytes = state_bytes + grad_bytes
    return {
        "state_bytes": state_bytes,
        "grad_bytes": grad_bytes,
        "read_bytes": read_bytes,
        "write_bytes": state_bytes,
        "files": sum(3 * bool(s) + len(gs) for s, gs in layout),
        "subgroups": len(layout),
        "init_write_s": init_s,
        "adam": bool(p.get("adam")),
        "rounds": rounds,
        "read_bw_bytes_s": read_bytes / statistics.median(r["read_s"] for r in rounds),
        "write_bw_bytes_s": state_bytes / statistics.median(r["write_s"] for r in rounds),
        "grad_write_bw_bytes_s": (
            grad_bytes / statistics.median(r["grad_write_s"] for r in rounds)
            if grad_bytes
            else None
        ),
    }


def main() -> None:
    report = private_stdout()
    result = rehearse(json.loads(sys.argv[1]))
    report.write(json.dumps(result) + "\n")
    report.flush()


if __name__ == "__main__":
    main()
