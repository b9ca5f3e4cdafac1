"""Worker: the host's memory bandwidth, STREAM's way, at each of several thread counts.

    python -m iotune.workers.membw ELEMENTS REPEATS T,T,...

Three fp32 arrays of ELEMENTS each (far larger than any cache); at each thread count
(torch's intra-op pool, OpenMP) the best of REPEATS passes of each kernel, counted as STREAM
counts them: copy ``a = b`` moves 2 x 4 bytes an element (a read, a write), triad
``a = b + s * c`` 3 x 4 bytes (two reads, a write; the write-allocate read is not counted,
so the figures are comparable with STREAM's and below the memory's theoretical rate).
Prints one JSON object on the original stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time

from iotune.workers import private_stdout

#: bytes an element each kernel moves, as STREAM counts them
KERNEL_BYTES = {"copy": 2 * 4, "triad": 3 * 4}


def main() -> None:
    report = private_stdout()
    n, repeats = int(sys.argv[1]), int(sys.argv[2])
    counts = [int(t) for t in sys.argv[3].split(",")]
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    a = torch.zeros(n, dtype=torch.float32)
    b = torch.rand(n, dtype=torch.float32)
    c = torch.rand(n, dtype=torch.float32)

    def copy() -> None:
        a.copy_(b)

    def triad() -> None:
        torch.add(b, c, alpha=3.0, out=a)

    kernels = {"copy": copy, "triad": triad}
    rows = []
    for t in counts:
        torch.set_num_threads(t)
        row: dict[str, object] = {"threads": t}
        for name, kernel in kernels.items():
            kernel()  # warm-up: the pages touched, the pool started
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                kernel()
                best = min(best, time.perf_counter() - t0)
            moved = KERNEL_BYTES[name] * n
            row[f"{name}_bytes"] = moved
            row[f"{name}_s"] = best
            row[f"{name}_bytes_s"] = moved / best
        rows.append(row)
    report.write(json.dumps({"elements": n, "repeats": repeats, "rows": rows}) + "\n")
    report.flush()


if __name__ == "__main__":
    main()
