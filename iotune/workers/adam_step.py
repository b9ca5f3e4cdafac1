"""Worker: time DeepSpeedCPUAdam optimizer steps for N fp32 parameters.

    OMP_NUM_THREADS=T python -m iotune.workers.adam_step N REPEATS
    OMP_NUM_THREADS=T python -m iotune.workers.adam_step N --serve

OMP_NUM_THREADS must be set before the cpu_adam op loads, hence one process per thread
count. Prints one JSON object on the original stdout. With ``--serve`` it is one rank of
several stepping at once (iotune.sweep.threads): once its optimizer is built and warmed up
it answers ``{"ready": ...}``, then times one step for each request line on stdin and
answers ``{"ms": ...}``, so the caller starts every rank's step together, as the ranks of a
training run meet at each step.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

from iotune.workers import private_stdout


def _optimizer(n: int) -> tuple[Any, int]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
    p.grad = torch.randn(n, dtype=torch.float32)
    opt = DeepSpeedCPUAdam([p], lr=1e-4)
    opt.step()  # warm-up: allocates the moments
    return opt, threads


def _timed(opt: Any) -> float:
    t0 = time.perf_counter()
    opt.step()
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    report = private_stdout()
    n = int(sys.argv[1])
    opt, threads = _optimizer(n)

    def say(doc: dict[str, Any]) -> None:
        report.write(json.dumps(doc) + "\n")
        report.flush()

    if sys.argv[2] == "--serve":
        for line in sys.stdin:
            req = json.loads(line)
            say({"ready": True, "threads": threads} if req.get("ready") else {"ms": _timed(opt)})
        return
    times = [_timed(opt) for _ in range(int(sys.argv[2]))]
    say(
        {
            "threads": threads,
            "params": n,
            "step_ms": times,
            "step_ms_median": statistics.median(times),
            "step_ms_min": min(times),
            "step_ms_max": max(times),
        }
    )


if __name__ == "__main__":
    main()
