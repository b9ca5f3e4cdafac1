"""Loads bpf/reqsize.bpf.c through bcc and reads its maps."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import re
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from iotune.errors import IotuneError, UsageError
from iotune.paths import bpf_source
from iotune.trace.btf import BtfError, attach, attach_tp_btf, btf_cflags

log = logging.getLogger("iotune.trace")

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
HINT_DOCTOR = (
    "'iotune doctor --for trace' checks headers, tracefs and BPF; or use --backend diskstats"
)
#: the block events the BTF programs (btf__EVENT in bpf/reqsize.bpf.c) attach to, besides
#: block_bio_queue with owners
BTF_EVENTS = ("block_rq_issue", "block_rq_requeue", "block_rq_complete", "block_rq_insert")
#: the latency and depth arrays (bpf/iotune.h): slots of a latency histogram, of the depth
#: histogram, words per device row of ``inflight``
LAT_SLOTS = 592
DEPTH_SLOTS = 1024
INFLIGHT_WORDS = 8
#: the request size the tracers' latency keeps apart unless told otherwise (DeepSpeed's AIO)
FOCUS_DEFAULT = 524288
#: a filter (bpf/iotune.h ONLY_*): the workload's process tree, or one cgroup v2 and the
#: cgroups below it
ONLY = {None: 0, "workload": 1, "cgroup": 2}


#: (kernel dev, op index) → (ios, sectors) completed; op OP_EMPTY_PREFLUSH included
Done = dict[tuple[int, int], tuple[int, int]]
#: (kernel dev, op index, tgid; 0 = the workload) → (bios, sectors) submitted
Owners = dict[tuple[int, int, int], tuple[int, int]]


class MapReader:
    """What both tracers read from the maps of bpf/iotune.h, whoever loaded them: bcc
    (:class:`ReqSizeTracer`) or libbpf (iotune.trace.libbpf). A subclass says how to reach a
    map: its items, its fd, one u64 of an array, an update; and fills :attr:`rows` (the
    devices with a row of the arrays) and :attr:`_views` (their read-only mappings)."""

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


class ReqSizeTracer(MapReader):
    """Attached on construction; :meth:`close` detaches (idempotent). With ``owners``, bios are
    attributed to the workload (processes added with :meth:`add_workload` and everything they
    start) or to their other submitters.

    The block events are read by BTF tracepoint programs where the kernel has BTF and the
    tracepoints' arguments are the ones they read (``btf`` None, the default), otherwise by
    classic tracepoint programs, which cost the kernel a filled event record per request
    before they run (:attr:`fallback` says why they were used). ``btf`` True asks for the BTF
    programs (an error where they cannot load), False for the classic ones. :attr:`probes`
    says which ran: ``"tp_btf"`` or ``"tracepoint"``. ``nested`` (classic programs only)
    counts events skipped on a CPU busy with the tracer; None: on kernels that do not count
    them."""

    def __init__(
        self,
        devs: list[int] | None,
        owners: bool = False,
        nested: bool | None = None,
        btf: bool | None = None,
        focus: int = FOCUS_DEFAULT,
        latency: bool = True,
        only: str | None = None,
        cgroup: str | None = None,
    ) -> None:
        if only is not None:
            # the filter reads the request's first bio: BTF programs only; the workload's
            # set is the owners' machinery
            if btf is False or nested:
                raise ValueError("a filter needs the BTF programs")
            btf, owners = True, True
        if btf and nested:
            raise ValueError("nested counting is done by the classic programs: not with btf=True")
        # before the programs attach: what runs between attaching and the first sample
        # widens the window in which bios are counted and requests are not
        import numpy  # noqa: F401 - imported here for _view, before the attach

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
            f"-DSLOT_DEVS={min(len(devs or []), SLOT_DEVS)}",
            "-DDEVS={" + ",".join(f"{d}U" for d in (devs or [])[:SLOT_DEVS]) + "}",
            f"-DSLOT_SECTORS={SLOT_SECTORS}",
            f"-DDONE_OPS={DONE_OPS}",
            f"-DOWNER_OPS={OWNER_OPS}",
            f"-DFILTER={1 if devs else 0}",
            f"-DOWNERS={1 if owners else 0}",
            f"-DFOCUS_BYTES={int(focus)}U",
            f"-DLATENCY={1 if latency else 0}",
            f"-DONLY={ONLY[only]}",
        ]
        self.owners_enabled = owners
        self.latency_enabled = latency
        self._links: list[tuple[str, int, int]] = []  # (event, program fd, link fd; -1: off)
        self._detached: list[bytes] = []  # classic tracepoints switch() took off
        self._detached_raw: list[bytes] = []
        self._bpf: Any = None
        #: why the classic programs read the events where BTF ones were wanted (None: they
        #: were not wanted, or the BTF ones run)
        self.fallback: str | None = None
        self.probes = "tracepoint"
        # by default BTF programs, unless nested counting (the classic programs') is asked for
        want_btf = btf if btf is not None else not nested
        if want_btf:
            try:
                btf_flags, self._tp_ids = btf_cflags(owners=owners)
                self._load(bcc, source, [*cflags, "-DBTF_TP=1", "-DNESTED=0", *btf_flags])
                if only == "cgroup":
                    self._put_cgroup(cgroup)  # before the programs attach
                self._attach_btf(bcc, owners, latency)
                self.probes = "tp_btf"
            except UsageError:
                self.close()
                raise
            except (BtfError, IotuneError) as exc:
                self.close()  # what attached before the failure
                if only is not None:
                    raise IotuneError(
                        f"--pid and --cgroup need BTF tracepoint programs: {exc}", hint=HINT_DOCTOR
                    ) from exc
                if btf:
                    raise IotuneError(f"BTF tracepoints: {exc}", hint=HINT_DOCTOR) from exc
                self.fallback = str(exc)
                log.info("classic tracepoint programs: BTF ones did not load (%s)", exc)
        if self.probes == "tracepoint":
            # the raw tracepoints counting skipped events: where the kernel does not
            counts = not kernel_counts_misses() if nested is None else nested
            self._load(bcc, source, [*cflags, "-DBTF_TP=0", f"-DNESTED={int(counts)}"])
        try:
            # the first SLOT_DEVS devices get a row of the arrays (no hash lookup per request)
            self.rows = list(devs or [])[:SLOT_DEVS]
            if devs:
                loaded: Any = self._bpf  # set by _load() (close() above may have unset it)
                table = loaded["devices"]
                for i, d in enumerate(devs):
                    row = i + 1 if i < SLOT_DEVS else NO_ROW
                    table[ctypes.c_uint32(d)] = ctypes.c_uint32(row)
            self._map_views(len(self.rows), owners)
        except BaseException:
            self.close()  # attached: detach before the error leaves
            raise

    def _load(self, bcc: Any, source: Path, cflags: list[str]) -> None:
        log.debug("loading %s with %s", source, cflags)
        try:
            self._bpf = bcc.BPF(src_file=str(source).encode(), cflags=cflags)
        except Exception as exc:
            raise IotuneError(
                f"loading {source.name} failed: {str(exc).strip().splitlines()[-1]}",
                hint=HINT_DOCTOR,
            ) from exc

    def _put_cgroup(self, path: str | None) -> None:
        """The cgroup of the filter into slot 0 of ``only_cgroup``."""
        with cgroup_fd(path) as fd:
            try:
                self._bpf["only_cgroup"][0] = fd
            except Exception as exc:  # bcc raises a plain Exception where an update fails
                raise not_a_cgroup(path, str(exc)) from exc

    def _attach_btf(self, bcc: Any, owners: bool, latency: bool) -> None:
        """Load and attach the ``btf__*`` programs that bcc compiled (bcc does not load this
        kind itself)."""
        lib = bcc.libbcc.lib
        module = self._bpf.module
        license = lib.bpf_module_license(module) or b"GPL"
        events = [e for e in BTF_EVENTS if latency or e != "block_rq_insert"]
        events += ["block_bio_queue"] if owners else []
        for event in events:
            fn = f"btf__{event}".encode()
            start = lib.bpf_function_start(module, fn)
            if not start:
                raise BtfError(f"{fn.decode()} was not compiled")
            size = lib.bpf_function_size(module, fn)
            prog, link = attach_tp_btf(
                start, size, license, event, self._tp_ids[event], self._tp_ids["attach_type"]
            )
            self._links.append((event, prog, link))

    def switch(self, on: bool, events: Collection[str] | None = None) -> None:
        """Detach the block event programs (``on`` False) or attach them again, the maps and
        the counts kept: a workload that runs on can be measured with and without them
        (benchmarks/trace_toggle.py). ``events`` (BTF programs only) switches just these
        (``block_rq_issue`` ...)."""
        if events is not None:
            if self.probes != "tp_btf":
                raise ValueError("switching single events is for the BTF programs")
            known = [event for event, _, _ in self._links]
            if isinstance(events, str) or not set(events) <= set(known):
                raise ValueError(f"not events of the BTF programs: {events!r} (they: {known})")
        if self.probes == "tp_btf":
            for i, (event, prog, link) in enumerate(self._links):
                if events is not None and event not in events:
                    continue
                # one at a time, recorded as it changes: a failure leaves no link unrecorded
                if not on and link >= 0:
                    os.close(link)
                    self._links[i] = (event, prog, -1)
                elif on and link < 0:
                    self._links[i] = (event, prog, attach(prog))
            return
        bpf = self._bpf
        if not on:
            for tp in [tp for tp in bpf.tracepoint_fds if tp.startswith(b"block:")]:
                bpf.detach_tracepoint(tp)
                self._detached.append(tp)
            for tp in list(bpf.raw_tracepoint_fds):
                bpf.detach_raw_tracepoint(tp)
                self._detached_raw.append(tp)
            return
        while self._detached:
            tp = self._detached[-1]
            bpf.attach_tracepoint(tp=tp, fn_name=b"tracepoint__" + tp.replace(b":", b"__"))
            self._detached.pop()
        while self._detached_raw:
            tp = self._detached_raw[-1]
            bpf.attach_raw_tracepoint(tp=tp, fn_name=b"raw_tracepoint__" + tp)
            self._detached_raw.pop()

    def misses(self) -> dict[str, int]:
        """Events the kernel did not deliver, per program: a tracepoint program that fires
        while another BPF program runs on the same CPU (an I/O completion interrupting an
        issue) is skipped. Kernels from 6.7 count that in the program's recursion_misses
        (``block:block_rq_complete`` …); on every kernel, the events that fired while one of
        this tracer's programs ran are counted by raw tracepoints (``nested:block_rq_issue``,
        ``nested:block_rq_complete``). BTF tracepoint programs are skipped only when one would
        run inside itself on a CPU, which every kernel that has them counts in their
        recursion_misses. All are cumulative since the tracer was loaded."""
        out = super().misses()
        for i, event in enumerate(("block_rq_issue", "block_rq_complete")):
            out[f"nested:{event}"] = self._array_u64("nested", i)
        return out

    def programs(self) -> list[tuple[str, int]]:
        """(event, program fd) of the programs run at the traced events
        (``block:block_rq_issue`` …, ``sched:sched_process_fork``); the raw tracepoints that
        count skipped events are left out: they count, they are not counted."""
        progs = [
            (name.decode().removeprefix("tracepoint__").replace("__", ":"), fn.fd)
            for name, fn in self._bpf.funcs.items()
            if name.startswith(b"tracepoint__")
        ]
        return progs + [(f"block:{event}", prog) for event, prog, _ in self._links]

    def _items(self, name: str) -> list[tuple[Any, Any]]:
        return list(self._bpf[name].items())

    def _map_fd(self, name: str) -> int:
        return int(self._bpf[name].map_fd)

    def _array_u64(self, name: str, index: int) -> int:
        return int(self._bpf[name][ctypes.c_int(index)].value)

    def _update(self, name: str, key: Any, value: Any) -> None:
        self._bpf[name][key] = value

    def close(self) -> None:
        self._unmap()
        for _, prog, link in self._links:
            if link >= 0:
                os.close(link)
            os.close(prog)
        self._links = []
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None


@contextlib.contextmanager
def cgroup_fd(path: str | None) -> Iterator[int]:
    """A file descriptor of the cgroup v2 directory *path*, for a cgroup array's slot (the
    map holds the cgroup itself once set: the descriptor is closed after)."""
    if not path:
        raise ValueError("a cgroup filter needs the cgroup's path")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise not_a_cgroup(path, str(exc.strerror)) from exc
    try:
        yield fd
    finally:
        os.close(fd)


def not_a_cgroup(path: str | None, why: str) -> UsageError:
    """The cgroup of a filter cannot be opened, or the kernel does not take it as a cgroup
    v2 (a cgroup v1 directory, one removed meanwhile)."""
    return UsageError(
        f"--cgroup {path}: not a cgroup v2 the kernel can filter by ({why})",
        hint="name a directory under the cgroup2 mount, e.g. /sys/fs/cgroup/system.slice/X",
    )


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


def kernel_counts_misses(release: str | None = None) -> bool:
    """Whether the kernel counts the tracepoint events it skips on a CPU busy with another BPF
    program (recursion_misses of tracepoint programs, 6.7 and later): then the tracer need not
    count them itself with raw tracepoints."""
    rel = release or os.uname().release
    m = re.match(r"(\d+)\.(\d+)", rel)
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (6, 7)
