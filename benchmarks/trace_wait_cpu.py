"""The tracing process's own CPU while a workload runs, side by side in one run: as iotune
traces (asleep between samples until the workload writes an event or ends:
iotune/trace/wake.py) against looking twenty times a second (what it did before, and what it
still does where the kernel has no inotify or pidfd).

    sudo .venv/bin/python benchmarks/trace_wait_cpu.py [--rounds 5] [--seconds 20] [--device vda]

The workload writes one step event a second to the trace's events file for --seconds, and
does nothing else; the drive is the host's own, idle. Each round runs both, in alternating
order; the script prints each run's ``tracer_cpu_s`` (the CPU of the tracing process while
it traced: samples, events) and the median of the ratios. On a host's own CPU this is a few
tenths of a per cent of a CPU either way; where Python is slow (an emulated guest, thirty
times slower) it is what the tracer takes from the workload.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from iotune.probes.sysfs import SysTree
from iotune.trace.backend import libbpf_problem
from iotune.trace.request import TraceRequest
from iotune.trace.runner import Tracer
from iotune.trace.targets import resolve_devices

#: the workload: a step event a second, as a training worker writes them
STEPS = """
import json, os, sys, time
n = int(float(sys.argv[1]))
with open(os.environ["IOTUNE_EVENTS"], "a") as fh:
    for step in range(1, n + 1):
        time.sleep(1)
        fh.write(json.dumps({"event": "step", "step": step}) + "\\n")
        fh.flush()
"""


def traced(device: str, seconds: float, poll: bool) -> float:
    with tempfile.TemporaryDirectory(prefix="iotune-bench-") as d:
        req = TraceRequest(
            targets=resolve_devices(SysTree("/"), [device]),
            backend="libbpf" if libbpf_problem() is None else "bcc",
            focus=512 * 1024,
            interval=1.0,
            out=Path(d),
            command=[sys.executable, "-c", STEPS, str(seconds)],
        )
        t = Tracer(req)
        if poll:
            t.wake.woken_by_kernel = False  # its sleep capped at POLL_S: twenty looks a second
        t.run()
        if t.tracer_cpu_s is None:
            raise SystemExit("the trace recorded no CPU time")
        return t.tracer_cpu_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--device", default="vda")
    a = ap.parse_args()
    ratios = []
    for r in range(a.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {poll: traced(a.device, a.seconds, poll) for poll in order}
        ratios.append(got[False] / got[True])
        print(
            f"round {r + 1}: asleep until woken {got[False]:.3f} s, twenty looks a second "
            f"{got[True]:.3f} s of the tracer's CPU over {a.seconds:.0f} s: {ratios[-1]:.2f}x",
            flush=True,
        )
    print(
        f"median ratio (asleep / looking): {statistics.median(ratios):.2f}x over {a.rounds} rounds"
    )


if __name__ == "__main__":
    main()
