"""Loads bpf/reqsize.bpf.c through bcc: the programs compiled for this kernel (BTF tracepoint
programs, or classic ones where they cannot load), attached, switched off and on, detached;
their maps are read by :class:`iotune.trace.mapreader.MapReader`."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from iotune.errors import IotuneError, UsageError
from iotune.paths import bpf_source
from iotune.trace.btf import BtfError, attach, attach_tp_btf, btf_cflags
from iotune.trace.mapreader import (
    DONE_OPS,
    MAX_SIZES,
    NO_ROW,
    OWNER_OPS,
    SLOT_DEVS,
    SLOT_SECTORS,
    MapReader,
)

log = logging.getLogger("iotune.trace")

HINT_DOCTOR = (
    "'iotune doctor --for trace' checks headers, tracefs and BPF; or use --backend diskstats"
)
#: the block events the BTF programs (btf__EVENT in bpf/reqsize.bpf.c) attach to, besides
#: block_bio_queue with owners
BTF_EVENTS = ("block_rq_issue", "block_rq_requeue", "block_rq_complete", "block_rq_insert")
#: the request size the tracers' latency keeps apart unless told otherwise (DeepSpeed's AIO)
FOCUS_DEFAULT = 524288
#: a filter (bpf/iotune.h ONLY_*): the workload's process tree, or one cgroup v2 and the
#: cgroups below it
ONLY = {None: 0, "workload": 1, "cgroup": 2}


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


def kernel_counts_misses(release: str | None = None) -> bool:
    """Whether the kernel counts the tracepoint events it skips on a CPU busy with another BPF
    program (recursion_misses of tracepoint programs, 6.7 and later): then the tracer need not
    count them itself with raw tracepoints."""
    rel = release or os.uname().release
    m = re.match(r"(\d+)\.(\d+)", rel)
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (6, 7)
