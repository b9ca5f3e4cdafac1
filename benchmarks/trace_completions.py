"""Do the tracer's completion programs see every completion the kernel counts?

A loop device with direct I/O over a file in --dir (default /var/tmp: on the host's own
drive, so the loop device's requests complete from that drive's interrupts), fio doing
mixed random reads and writes of 4 KiB to 1 MiB on it throughout, and iotune's tracer loaded
three times on it: libbpf's CO-RE object, and bcc's build with BTF tracepoint programs and
with classic tracepoint programs. Every
second it prints, per kind, the completions traced minus the completions the kernel counted
in /sys/block/DEV/stat since the start (reads, writes), and at the end each kind's recursion
misses (events the kernel says it did not deliver). The counters are read one after the
other while I/O goes on, so each line carries a few requests of jitter; a loss shows as a
step that stays.

    sudo .venv/bin/python benchmarks/trace_completions.py [--dir /var/tmp] [--seconds 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.loopdev import loop_device
from iotune.trace.bpf import MapReader, ReqSizeTracer
from iotune.trace.libbpf import LibbpfTracer
from iotune.trace.targets import kernel_dev


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--dir",
        default="/var/tmp",  # noqa: S108 - on the host's drive, on purpose
        help="where the loop device's file lives",
    )
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--size-mib", type=int, default=2048)
    args = ap.parse_args()
    stack = ExitStack()  # closed last: the loop device goes after fio and the tracers
    loop = stack.enter_context(loop_device(args.dir, args.size_mib, filled=False, direct_io=True))
    dev = Path(loop).name
    fio = None
    tracers: dict[str, MapReader] = {}
    try:
        fio = subprocess.Popen(
            ["fio", "--name=mix", f"--filename={loop}", "--direct=1", "--ioengine=libaio",
             "--iodepth=16", "--rw=randrw", "--rwmixread=70",
             "--bssplit=4k/30:64k/20:512k/40:1m/10", "--time_based", "--runtime=100000",
             "--numjobs=2", "--group_reporting"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(2)
        ma, mi = map(int, Path(f"/sys/block/{dev}/dev").read_text().split(":"))
        kd = kernel_dev(ma, mi)
        tracers["libbpf"] = LibbpfTracer([kd])  # each closed below if the next fails
        for kind, btf in (("bcc tp_btf", True), ("bcc tracepoint", False)):
            tracers[kind] = ReqSizeTracer([kd], btf=btf)

        def kernel() -> tuple[int, int]:
            f = Path(f"/sys/block/{dev}/stat").read_text().split()
            return int(f[0]), int(f[4])

        def done(t: MapReader) -> tuple[int, int]:
            d = t.done()
            return d.get((kd, 0), (0, 0))[0], d.get((kd, 1), (0, 0))[0]

        k0 = kernel()
        d0 = {n: done(t) for n, t in tracers.items()}
        m0 = {n: t.misses() for n, t in tracers.items()}
        print(
            f"{dev} over a file in {args.dir}; traced minus kernel completions since the start (read, write)"
        )
        print(
            f"{'s':>3} {'kernel reads':>12} {'writes':>8}  "
            + "  ".join(f"{n:>14}" for n in tracers)
        )
        for s in range(1, args.seconds + 1):
            time.sleep(1)
            k = kernel()
            row = []
            for n, t in tracers.items():
                d = done(t)
                dr = d[0] - d0[n][0] - (k[0] - k0[0])
                dw = d[1] - d0[n][1] - (k[1] - k0[1])
                row.append(f"{dr:+7d} {dw:+6d}")
            print(f"{s:3d} {k[0] - k0[0]:12d} {k[1] - k0[1]:8d}  " + "  ".join(row), flush=True)
        for n, t in tracers.items():
            m = {e: v - m0[n].get(e, 0) for e, v in t.misses().items() if v - m0[n].get(e, 0)}
            print(f"recursion misses, {n}: {m or 'none'}")
        # every class of completion each counted, since it was loaded (a request counted
        # under another class than the kernel's would show here)
        for n, t in tracers.items():
            print(
                f"completions by class, {n}: {sorted((op, v) for (d, op), v in t.done().items() if d == kd)}"
            )
        print(f"kernel /sys/block/{dev}/stat: {Path(f'/sys/block/{dev}/stat').read_text().split()}")
    finally:
        for t in tracers.values():
            t.close()
        if fio is not None:
            fio.terminate()
            fio.wait()
        stack.close()


if __name__ == "__main__":
    main()
