"""Loads bpf/reqsize.bpf.c through bcc and reads its maps."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from iotune.errors import IotuneError
from iotune.paths import bpf_source

log = logging.getLogger("iotune.trace")

MAX_SIZES = 65536  # distinct (dev, op, size) keys; sizes are 512-byte multiples ≤ max_sectors_kb


class SizeKey(ctypes.Structure):  # struct size_key in bpf/iotune.h
    _fields_ = [
        ("dev", ctypes.c_uint32),
        ("op", ctypes.c_uint32),
        ("bytes", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class DoneKey(ctypes.Structure):  # struct done_key
    _fields_ = [("dev", ctypes.c_uint32), ("op", ctypes.c_uint32)]


#: (kernel dev, op index) → (ios, sectors) completed; op OP_EMPTY_PREFLUSH included
Done = dict[tuple[int, int], tuple[int, int]]
#: (kernel dev, op index, tgid; 0 = the workload) → (bios, sectors) submitted
Owners = dict[tuple[int, int, int], tuple[int, int]]


class ReqSizeTracer:
    """Attached on construction; :meth:`close` detaches (idempotent). With ``owners``, bios are
    attributed to the workload (processes added with :meth:`add_workload` and everything they
    start) or to their other submitters."""

    def __init__(self, devs: list[int] | None, owners: bool = False) -> None:
        try:
            import bcc
        except ImportError as exc:
            raise IotuneError(
                "bcc is not importable",
                hint="apt-get install python3-bpfcc, then scripts/setup.sh links it into the "
                "virtualenv; or use --backend diskstats",
            ) from exc
        source = bpf_source("reqsize.bpf.c")
        cflags = [
            f"-I{source.parent}",
            f"-DMAX_SIZES={MAX_SIZES}",
            f"-DFILTER={1 if devs else 0}",
            f"-DOWNERS={1 if owners else 0}",
        ]
        self.owners_enabled = owners
        log.debug("loading %s with %s", source, cflags)
        try:
            self._bpf: Any = bcc.BPF(src_file=str(source).encode(), cflags=cflags)
        except Exception as exc:
            raise IotuneError(
                f"loading {source.name} failed: {str(exc).strip().splitlines()[-1]}",
                hint="'iotune doctor --for trace' checks headers, tracefs and BPF; "
                "or use --backend diskstats",
            ) from exc
        if devs:
            table = self._bpf["devices"]
            for d in devs:
                table[ctypes.c_uint32(d)] = ctypes.c_uint8(1)

    def counts(self) -> dict[tuple[int, int, int], int]:
        return {(k.dev, k.op, k.bytes): v.value for k, v in self._bpf["sizes"].items()}

    def hist(self) -> dict[tuple[int, int, int], int]:
        """(dev, op, log2 slot) -> requests, from the exact counts (bcc's bpf_log2l slots:
        slot k holds sizes in [2^(k-1), 2^k - 1], slot 0 the empty requests)."""
        return log2_hist(self.counts())

    def done(self) -> Done:
        return {(k.dev, k.op): (v.ios, v.sectors) for k, v in self._bpf["done"].items()}

    def add_workload(self, pid: int) -> None:
        if self.owners_enabled:
            self._bpf["workload"][ctypes.c_uint32(pid)] = ctypes.c_uint8(1)

    def owners(self) -> Owners:
        if not self.owners_enabled:
            return {}
        return {(k.dev, k.op, k.tgid): (v.bios, v.sectors) for k, v in self._bpf["owners"].items()}

    def comms(self) -> dict[int, str]:
        if not self.owners_enabled:
            return {}
        return {
            k.value: bytes(v.comm).split(b"\0", 1)[0].decode(errors="replace")
            for k, v in self._bpf["comms"].items()
        }

    def misses(self) -> dict[str, int]:
        """Events the kernel did not deliver, per program: a tracepoint program that fires
        while another BPF program runs on the same CPU (an I/O completion interrupting an
        issue) is skipped. Kernels from 6.7 count that in the program's recursion_misses
        (``block:block_rq_complete`` …); on every kernel, the events that fired while one of
        this tracer's programs ran are counted by raw tracepoints (``nested:block_rq_issue``,
        ``nested:block_rq_complete``). Both are cumulative since the tracer was loaded."""
        out = {}
        for name, fn in self._bpf.funcs.items():
            if not name.startswith(b"tracepoint__"):
                continue  # the raw tracepoints: they count, they are not counted
            label = name.decode().removeprefix("tracepoint__").replace("__", ":")
            try:
                with open(f"/proc/self/fdinfo/{fn.fd}") as fh:
                    for line in fh:
                        if line.startswith("recursion_misses:"):
                            out[label] = int(line.split()[1])
            except OSError:
                continue
        t = self._bpf["nested"]
        for i, event in enumerate(("block_rq_issue", "block_rq_complete")):
            out[f"nested:{event}"] = int(t[ctypes.c_int(i)].value)
        return out

    def dropped(self) -> tuple[int, int, int, int]:
        t = self._bpf["dropped"]
        a, b, c, d = (int(t[ctypes.c_int(i)].value) for i in range(4))
        return a, b, c, d

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None


def log2_hist(counts: dict[tuple[int, int, int], int]) -> dict[tuple[int, int, int], int]:
    """A log2 histogram from exact (dev, op, bytes) counts. Pure."""
    out: dict[tuple[int, int, int], int] = {}
    for (dev, op, size), n in counts.items():
        key = (dev, op, size.bit_length())
        out[key] = out.get(key, 0) + n
    return {k: v for k, v in out.items() if v}
