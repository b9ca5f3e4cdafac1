"""What both tracers read from the maps of bpf/iotune.h, whoever loaded them (bcc:
iotune.trace.bpf; libbpf: iotune.trace.libbpf): the sizes of its arrays and maps, which the
programs are built with (tests/unit/test_libbpf_object.py holds them to the C source), and
:class:`MapReader`, which reads the counts, completions, owners and latency arrays, and each
program's run time and misses from its fdinfo."""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: devices with a row in the in-kernel arrays (the rest use the hash maps only)
SLOT_DEVS = 16
#: the largest request the arrays count, in 512-byte sectors (1 MiB; larger ones: hash map)
SLOT_SECTORS = 2048
#: completion classes per device (OP_* up to OP_FLUSH_SEQ_DONE) and bio op classes
DONE_OPS = 8
OWNER_OPS = 5
#: a traced device without a row (bpf/reqsize.bpf.c NO_ROW)
NO_ROW = 0xFFFF
MAX_SIZES = 65536  # distinct (dev, op, size) keys; sizes are 512-byte multiples ≤ max_sectors_kb
#: the latency and depth arrays (bpf/iotune.h): slots of a latency histogram, of the depth
#: histogram, words per device row of ``inflight``
LAT_SLOTS = 592
DEPTH_SLOTS = 1024
INFLIGHT_WORDS = 8


#: (kernel dev, op index) → (ios, sectors) completed; op OP_EMPTY_PREFLUSH included
Done = dict[tuple[int, int], tuple[int, int]]
#: (kernel dev, op index, tgid; 0 = the workload) → (bios, sectors) submitted
Owners = dict[tuple[int, int, int], tuple[int, int]]


class MapReader:
    """What both tracers read from the maps of bpf/iotune.h, whoever loaded them: bcc
    (:class:`iotune.trace.bpf.ReqSizeTracer`) or libbpf (iotune.trace.libbpf). A subclass
    says how to reach a map: its items, its fd, one u64 of an array, an update; and fills
    :attr:`rows` (the devices with a row of the arrays) and :attr:`_views` (their read-only
    mappings)."""

    owners_enabled = False
    latency_enabled = False
    rows: list[int]
    _views: dict[str, Any]

    def _items(self, name: str) -> list[tuple[Any, Any]]:
        raise NotImplementedError

    def _map_fd(self, name: str) -> int:
        raise NotImplementedError

    def _array_u64(self, name: str, index: int) -> int:
        raise NotImplementedError

    def _update(self, name: str, key: Any, value: Any) -> None:
        raise NotImplementedError

    def programs(self) -> list[tuple[str, int]]:
        raise NotImplementedError

    def misses(self) -> dict[str, int]:
        """Per program, the events the kernel did not deliver to it (its recursion_misses,
        where the kernel counts them), cumulative since the tracer was loaded."""
        out = {}
        for label, fd in self.programs():
            info = prog_info(fd)
            if "recursion_misses" in info:
                out[label] = info["recursion_misses"]
        return out

    def close(self) -> None:
        raise NotImplementedError

    def _map_views(self, n: int, owners: bool) -> None:
        """Map the arrays of *n* device rows (none without rows)."""
        self._views = {}
        if n:
            self._views["slots"] = self._view("slots", n * 2 * (SLOT_SECTORS + 1))
            self._views["dones"] = self._view("dones", n * DONE_OPS * 2)
            if owners:
                self._views["wowners"] = self._view("wowners", n * OWNER_OPS * 2)
            for name, words in lat_arrays(n).items() if self.latency_enabled else ():
                self._views[name] = self._view(name, words)

    def _unmap(self) -> None:
        # the mappings go with the last view of them (an mmap cannot close while a numpy
        # array still exports its buffer)
        self._views = {}
        self._maps: list[mmap.mmap] = []

    def _view(self, name: str, words: int) -> Any:
        """A read-only numpy view of an mmap-able array map: its counters as the kernel
        updates them, read without a system call."""
        import numpy as np

        fd = self._map_fd(name)
        size = -(-words * 8 // mmap.PAGESIZE) * mmap.PAGESIZE
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        self._maps = [*getattr(self, "_maps", []), mm]
        return np.frombuffer(mm, dtype=np.uint64, count=words)

    def counts(self) -> dict[tuple[int, int, int], int]:
        out = {(k.dev, k.op, k.bytes): v.value for k, v in self._items("sizes")}
        view = self._snapshot("slots")
        if view is not None:
            width = SLOT_SECTORS + 1
            for i in view.nonzero()[0].tolist():
                row, rest = divmod(i, 2 * width)
                op, sectors = divmod(rest, width)
                out[(self.rows[row], op, sectors * 512)] = int(view[i])
        return out

    def hist(self) -> dict[tuple[int, int, int], int]:
        """(dev, op, log2 slot) -> requests, from the exact counts (bcc's bpf_log2l slots:
        slot k holds sizes in [2^(k-1), 2^k - 1], slot 0 the empty requests)."""
        return log2_hist(self.counts())

    def latency(self) -> dict[int, dict[str, Any]]:
        """Per device with a row: its latency arrays as of now (numpy copies): ``lat`` (op x
        class x slot: read/write, the focus size/any other), ``qlat`` (op x slot: insertion
        to issue), ``depth`` (slot per depth at issue), ``inflight`` (the words of
        bpf/iotune.h). Empty without rows."""
        views = {name: self._snapshot(name) for name in lat_arrays(1)}
        if any(v is None for v in views.values()):
            return {}
        shapes = {
            "lat": (2, 2, LAT_SLOTS),
            "qlat": (2, LAT_SLOTS),
            "depth": (DEPTH_SLOTS,),
            "inflight": (INFLIGHT_WORDS,),
        }
        out: dict[int, dict[str, Any]] = {}
        for i, dev in enumerate(self.rows):
            out[dev] = {
                name: views[name].reshape(len(self.rows), *shape)[i]
                for name, shape in shapes.items()
            }
        return out

    def done(self) -> Done:
        out = {(k.dev, k.op): (v.ios, v.sectors) for k, v in self._items("done")}
        for dev, op, pair in self._pairs("dones", DONE_OPS):
            out[(dev, op)] = pair
        return out

    def _snapshot(self, name: str) -> Any:
        """A copy of the array *name* (None without one): the kernel updates the mapped
        view while it is read, so every reader reads one copy of it."""
        view = self._views.get(name)
        return None if view is None else view.copy()

    def _pairs(self, name: str, ops: int) -> Iterator[tuple[int, int, tuple[int, int]]]:
        """(dev, op, (count, sectors)) of every non-zero entry of an array of two-counter
        values with *ops* entries per device row (dones, wowners)."""
        view = self._snapshot(name)
        if view is None:
            return
        pairs = view.reshape(-1, 2)
        for i in pairs.any(axis=1).nonzero()[0].tolist():
            row, op = divmod(i, ops)
            yield self.rows[row], op, (int(pairs[i, 0]), int(pairs[i, 1]))

    def add_workload(self, pid: int) -> None:
        if self.owners_enabled:
            self._update("workload", ctypes.c_uint32(pid), ctypes.c_uint8(1))
            # every CPU's cached answer is stale now (bpf/reqsize.bpf.c is_workload)
            gen = self._array_u64("generation", 0)
            self._update("generation", ctypes.c_uint32(0), ctypes.c_uint64(gen + 1))

    def owners(self) -> Owners:
        if not self.owners_enabled:
            return {}
        out = {(k.dev, k.op, k.tgid): (v.bios, v.sectors) for k, v in self._items("owners")}
        for dev, op, pair in self._pairs("wowners", OWNER_OPS):
            out[(dev, op, 0)] = pair  # tgid 0: the workload
        return out

    def comms(self) -> dict[int, str]:
        if not self.owners_enabled:
            return {}
        return {
            k.value: bytes(v.comm).split(b"\0", 1)[0].decode(errors="replace")
            for k, v in self._items("comms")
        }

    def dropped(self) -> tuple[int, int, int, int]:
        a, b, c, d = (self._array_u64("dropped", i) for i in range(4))
        return a, b, c, d


def lat_arrays(rows: int) -> dict[str, int]:
    """The latency arrays' sizes in u64 words for *rows* device rows (bpf/iotune.h)."""
    return {
        "lat": rows * 4 * LAT_SLOTS,
        "qlat": rows * 2 * LAT_SLOTS,
        "depth": rows * DEPTH_SLOTS,
        "inflight": rows * INFLIGHT_WORDS,
    }


def prog_info(fd: int) -> dict[str, int]:
    """The numeric fields of a BPF program's /proc/self/fdinfo (``run_time_ns``,
    ``run_cnt``, ``recursion_misses`` where the kernel has them); empty where it cannot be
    read."""
    try:
        text = Path(f"/proc/self/fdinfo/{fd}").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def log2_hist(counts: dict[tuple[int, int, int], int]) -> dict[tuple[int, int, int], int]:
    """A log2 histogram from exact (dev, op, bytes) counts. Pure."""
    out: dict[tuple[int, int, int], int] = {}
    for (dev, op, size), n in counts.items():
        key = (dev, op, size.bit_length())
        out[key] = out.get(key, 0) + n
    return {k: v for k, v in out.items() if v}
