"""Do the tracer's completion programs see every completion the kernel counts?

A loop device with direct I/O over a file in --dir (default /var/tmp: on the host's own
drive, so the loop device's requests complete from that drive's interrupts), fio doing
mixed random reads and writes of 4 KiB to 1 MiB on it throughout, and iotune's tracer loaded
three times on it: libbpf's CO-RE object, and bcc's build with BTF tracepoint programs and
with classic tracepoint programs. Every second it prints, since the start:
- per tracer, its completions minus the completions the kernel counted in
  /sys/block/DEV/stat (reads, writes), and its issues minus the kernel's completions and
  the change in requests in flight (reads, writes);
- the completions the kernel's own block_io_done tracepoint reached minus the kernel's
  count (reads and writes together).
At the end, each tracer's recursion misses (events the kernel says it did not deliver).
The counters are read one after the other while I/O goes on, so each line carries a few
requests of jitter; a loss shows as a step that stays.

    sudo .venv/bin/python benchmarks/trace_completions.py [--dir /var/tmp] [--seconds 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from contextlib import ExitStack, closing
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.loopdev import loop_device
from iotune.trace.bpf import ReqSizeTracer
from iotune.trace.btf import Btf
from iotune.trace.libbpf import LibbpfTracer
from iotune.trace.mapreader import MapReader
from iotune.trace.targets import kernel_dev

#: a raw tracepoint program on block_io_done, which blk_account_io_done() fires just before
#: it adds the io to /sys/block/DEV/stat: counts the device's requests (fields at the running
#: kernel's BTF offsets, so the headers' layout does not matter)
IO_DONE = r"""
#define RD(T, p, o) ({ T _v = 0; bpf_probe_read_kernel(&_v, sizeof(_v), (void *)(p) + (o)); _v; })
BPF_ARRAY(n, u64, 1);
RAW_TRACEPOINT_PROBE(block_io_done) {
    void *part = RD(void *, (void *)ctx->args[0], RQ_PART);
    if (!part || RD(u32, part, BD_DEV) != DEV)
        return 0;
    int i = 0;
    u64 *v = n.lookup(&i);
    if (v)
        __sync_fetch_and_add(v, 1);
    return 0;
}
"""


class IoDone:
    """Requests of one device (kernel dev_t) block_io_done fired for, reads and writes
    together (the kernel's stat adds both)."""

    def __init__(self, kd: int) -> None:
        sys.path.insert(0, "/usr/lib/python3/dist-packages")
        import bcc

        btf = Btf.vmlinux()
        flags = [
            f"-DRQ_PART={btf.offset('request', 'part')}",
            f"-DBD_DEV={btf.offset('block_device', 'bd_dev')}",
            f"-DDEV={kd}U",
        ]
        self._bpf = bcc.BPF(text=IO_DONE, cflags=flags)

    def count(self) -> int:
        return int(self._bpf["n"][0].value)

    def close(self) -> None:
        self._bpf.cleanup()


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
        io_done = stack.enter_context(closing(IoDone(kd)))

        def kernel() -> tuple[int, int]:
            f = Path(f"/sys/block/{dev}/stat").read_text().split()
            return int(f[0]), int(f[4])

        def inflight() -> tuple[int, int]:
            f = Path(f"/sys/block/{dev}/inflight").read_text().split()
            return int(f[0]), int(f[1])

        def done(t: MapReader) -> tuple[int, int]:
            d = t.done()
            return d.get((kd, 0), (0, 0))[0], d.get((kd, 1), (0, 0))[0]

        def issued(t: MapReader) -> tuple[int, int]:
            c = t.counts()
            return tuple(  # type: ignore[return-value]
                sum(n for (d, o, _), n in c.items() if d == kd and o == op) for op in (0, 1)
            )

        i0 = {n: issued(t) for n, t in tracers.items()}
        f0 = inflight()
        k0 = kernel()
        d0 = {n: done(t) for n, t in tracers.items()}
        n0 = io_done.count()
        m0 = {n: t.misses() for n, t in tracers.items()}
        print(
            f"{dev} over a file in {args.dir}; since the start (read, write): traced minus kernel "
            "completions, then issues minus the kernel's completions and the change in flight"
        )
        print(
            f"{'s':>3} {'kernel reads':>12} {'writes':>8}  "
            + "  ".join(f"{n + ' done':>14} {'issued':>13}" for n in tracers)
            + f"  {'io_done':>8}"
        )
        for s in range(1, args.seconds + 1):
            time.sleep(1)
            # issues first, then in flight, then the kernel's count, then completions: a request
            # issued or completed between two reads shows up as jitter of a few, either way
            i = {n: issued(t) for n, t in tracers.items()}
            f = inflight()
            k = kernel()
            row = []
            for n, t in tracers.items():
                d = done(t)
                dr = d[0] - d0[n][0] - (k[0] - k0[0])
                dw = d[1] - d0[n][1] - (k[1] - k0[1])
                ir = i[n][0] - i0[n][0] - (k[0] - k0[0]) - (f[0] - f0[0])
                iw = i[n][1] - i0[n][1] - (k[1] - k0[1]) - (f[1] - f0[1])
                row.append(f"{dr:+7d} {dw:+6d} {ir:+6d} {iw:+6d}")
            nd = io_done.count() - n0 - (k[0] - k0[0] + k[1] - k0[1])
            print(
                f"{s:3d} {k[0] - k0[0]:12d} {k[1] - k0[1]:8d}  " + "  ".join(row) + f"  {nd:+8d}",
                flush=True,
            )
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
