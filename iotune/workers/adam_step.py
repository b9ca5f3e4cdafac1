"""Worker: time DeepSpeedCPUAdam optimizer steps for N fp32 parameters.

    OMP_NUM_THREADS=T python -m iotune.workers.adam_step N REPEATS

OMP_NUM_THREADS must be set before the cpu_adam op loads, hence one process per thread
count. Prints one JSON object on the original stdout.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

from iotune.workers import private_stdout


def main() -> None:
    report = private_stdout()
    n, repeats = int(sys.argv[1]), int(sys.argv[2])
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
    p.grad = torch.randn(n, dtype=torch.float32)
    opt = DeepSpeedCPUAdam([p], lr=1e-4)
    opt.step()  # warm-up: allocates the moments
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        opt.step()
        times.append((time.perf_counter() - t0) * 1000)
    report.write(
        json.dumps(
            {
                "threads": threads,
                "params": n,
                "step_ms": times,
                "step_ms_median": statistics.median(times),
                "step_ms_min": min(times),
                "step_ms_max": max(times),
            }
        )
        + "\n"
    )
    report.flush()


if __name__ == "__main__":
    main()
