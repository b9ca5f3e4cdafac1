"""The tracer through libbpf: bpf/reqsize.core.bpf.o, a BPF CO-RE object compiled once
(bpf/build.sh), loaded by the system's libbpf (Debian's ``libbpf1``), which relocates its
field accesses to the running kernel's BTF. Nothing is compiled at run time: no bcc, LLVM or
kernel headers. The maps and the counting are those of the bcc build (bpf/iotune.h), read by
the same code (:class:`iotune.trace.mapreader.MapReader`).

The binding is a small typed ctypes layer over the libbpf 1.x calls used (open, size the
arrays, set the configuration, load, attach, map fds). libbpf 1.x returns NULL or a negative
error and sets errno; its own messages (the verifier's log included) are kept and the last of
them shown when a load fails."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

from iotune.errors import IotuneError
from iotune.paths import bpf_source
from iotune.trace.bpf import BTF_EVENTS, FOCUS_DEFAULT, ONLY, cgroup_fd, not_a_cgroup
from iotune.trace.mapreader import (
    DONE_OPS,
    NO_ROW,
    OWNER_OPS,
    SLOT_DEVS,
    SLOT_SECTORS,
    MapReader,
    lat_arrays,
)
from iotune.trace.maps import MAP_TYPES

log = logging.getLogger("iotune.trace")

OBJECT = "reqsize.core.bpf.o"
SIDECAR = "reqsize.core.bpf.sha256"
HINT = "'iotune doctor --for trace' says what the libbpf backend needs; or use --backend bcc"
#: the programs (bpf/reqsize.core.bpf.c) and their events; the last two only with owners
PROGRAMS = (*[(f"block:{e}", e) for e in BTF_EVENTS], ("block:block_bio_queue", "block_bio_queue"))
FORK = ("sched:sched_process_fork", "sched_process_fork")


class Config(ctypes.Structure):  # struct config in bpf/reqsize.core.bpf.c (its .rodata)
    _fields_ = [
        ("slot_devs", ctypes.c_uint32),
        ("filter", ctypes.c_uint32),
        ("devs", ctypes.c_uint32 * SLOT_DEVS),
        ("focus", ctypes.c_uint32),
        ("latency", ctypes.c_uint32),
        ("only", ctypes.c_uint32),
    ]


_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_messages: list[str] = []


def _on_print(level: int, fmt: bytes, args: int) -> int:
    """libbpf's messages, formatted with the C library's vsnprintf (a va_list is a pointer on
    the ABIs libbpf runs on); kept for the error of a failed load, logged at debug level."""
    buf = ctypes.create_string_buffer(1024)
    _libc().vsnprintf(buf, len(buf), fmt, ctypes.c_void_p(args))
    text = buf.value.decode(errors="replace").rstrip()
    if text:
        _messages.append(text)
        del _messages[:-200]
        log.debug("libbpf: %s", text)
    return 0


_print_cb = _PRINT_FN(_on_print)


@functools.cache
def _libc() -> Any:
    libc = ctypes.CDLL(None)
    libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
    return libc


def libbpf_path() -> str | None:
    """The libbpf shared library the loader would use (None: not installed)."""
    return ctypes.util.find_library("bpf")


@functools.cache
def lib() -> Any:
    """libbpf.so.1, its signatures declared (an IotuneError where it is missing or older than
    1.0, whose error conventions differ)."""
    try:
        so = ctypes.CDLL("libbpf.so.1", use_errno=True)
    except OSError as exc:
        raise IotuneError(
            "libbpf is not installed (libbpf.so.1 not found)",
            hint="apt-get install libbpf1; or use --backend bcc",
        ) from exc
    p, c_int, c_char_p, u32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32
    sigs: dict[str, tuple[Any, list[Any]]] = {
        "libbpf_major_version": (u32, []),
        "libbpf_minor_version": (u32, []),
        "libbpf_set_print": (p, [_PRINT_FN]),
        "bpf_object__open_file": (p, [c_char_p, p]),
        "bpf_object__load": (c_int, [p]),
        "bpf_object__close": (None, [p]),
        "bpf_object__find_map_by_name": (p, [p, c_char_p]),
        "bpf_object__next_map": (p, [p, p]),
        "bpf_object__find_program_by_name": (p, [p, c_char_p]),
        "bpf_object__next_program": (p, [p, p]),
        "bpf_map__name": (c_char_p, [p]),
        "bpf_map__fd": (c_int, [p]),
        "bpf_map__set_max_entries": (c_int, [p, u32]),
        "bpf_map__initial_value": (p, [p, ctypes.POINTER(ctypes.c_size_t)]),
        "bpf_map__set_initial_value": (c_int, [p, p, ctypes.c_size_t]),
        "bpf_program__set_autoload": (c_int, [p, ctypes.c_bool]),
        "bpf_program__fd": (c_int, [p]),
        "bpf_program__attach": (p, [p]),
        "bpf_link__destroy": (c_int, [p]),
        "bpf_map_lookup_elem": (c_int, [c_int, p, p]),
        "bpf_map_update_elem": (c_int, [c_int, p, p, ctypes.c_uint64]),
        "bpf_map_get_next_key": (c_int, [c_int, p, p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(so, name)
        fn.restype, fn.argtypes = res, args
    if so.libbpf_major_version() < 1:
        raise IotuneError(
            f"libbpf {so.libbpf_major_version()}.{so.libbpf_minor_version()} is older than 1.0",
            hint="install libbpf 1.x (Debian 12: libbpf1); or use --backend bcc",
        )
    so.libbpf_set_print(_print_cb)
    return so


def version() -> str:
    so = lib()
    return f"{so.libbpf_major_version()}.{so.libbpf_minor_version()}"


def object_path() -> Path:
    return bpf_source(OBJECT)


def check_object(path: Path | None = None) -> None:
    """The object is the one bpf/build.sh built from the sources beside it: its sha256 is the
    sidecar's (an IotuneError otherwise: a stale or damaged object is never loaded)."""
    obj = path or object_path()
    sidecar = obj.with_name(SIDECAR)
    try:
        digest = hashlib.sha256(obj.read_bytes()).hexdigest()
        lines = sidecar.read_text().splitlines()
    except OSError as exc:
        raise IotuneError(f"cannot read the BPF object: {exc}", hint=HINT) from exc
    want = {Path(f).name: h for h, _, f in (ln.partition("  ") for ln in lines if ln[:1] != "#")}
    if want.get(obj.name) != digest:
        raise IotuneError(
            f"{obj.name} is not the object its sidecar names (sha256 {digest[:12]}…)",
            hint="rebuild it with bpf/build.sh; or use --backend bcc",
        )


def _err(what: str) -> IotuneError:
    errno = ctypes.get_errno()
    detail = "; ".join(m for m in _messages[-3:] if m) or os.strerror(errno)
    return IotuneError(f"libbpf: {what} failed ({os.strerror(errno)}): {detail}", hint=HINT)


class LibbpfTracer(MapReader):
    """The interface of :class:`iotune.trace.bpf.ReqSizeTracer`, through libbpf: attached on
    construction; :meth:`close` detaches (idempotent). Its programs are always BTF
    tracepoints (:attr:`probes` ``"tp_btf"``)."""

    fallback: str | None = None
    probes = "tp_btf"

    def __init__(
        self,
        devs: list[int] | None,
        owners: bool = False,
        focus: int = FOCUS_DEFAULT,
        latency: bool = True,
        only: str | None = None,
        cgroup: str | None = None,
    ) -> None:
        import numpy  # noqa: F401 - before the attach, as the bcc tracer does

        so = lib()
        check_object()
        # a filter reads the bios' submitters: the owners' programs
        owners = owners or only is not None
        self.owners_enabled = owners
        self.latency_enabled = latency
        self._only = ONLY[only]
        self.rows = list(devs or [])[:SLOT_DEVS]
        self._views = {}
        self._links: dict[str, Any] = {}  # label -> struct bpf_link * (None: switched off)
        self._progs: dict[str, Any] = {}  # label -> struct bpf_program *
        self._fds: dict[str, int] = {}
        _messages.clear()
        self._obj = so.bpf_object__open_file(str(object_path()).encode(), None)
        if not self._obj:
            raise _err(f"opening {OBJECT}")
        try:
            self._configure(so, devs or [], owners, focus)
            if so.bpf_object__load(self._obj) != 0:
                raise _err(f"loading {OBJECT}")
            arrays = ["slots", "dones", "wowners", "dropped", "generation", *lat_arrays(0)]
            for name in [*MAP_TYPES, *arrays]:
                self._fds[name] = self._fd(so, name)
            if devs:
                for i, d in enumerate(devs):
                    row = i + 1 if i < SLOT_DEVS else NO_ROW
                    self._update("devices", ctypes.c_uint32(d), ctypes.c_uint32(row))
            # a CPU's zeroed cache is never valid (bpf/reqsize.core.bpf.c is_workload)
            self._update("generation", ctypes.c_uint32(0), ctypes.c_uint64(1))
            if only == "cgroup":
                self._put_cgroup(so, cgroup)  # before the programs attach
            self._map_views(len(self.rows), owners)
            for label in self._progs:
                self._attach(label)
        except BaseException:
            self.close()
            raise

    def _configure(self, so: Any, devs: list[int], owners: bool, focus: int) -> None:
        """Before the load: the arrays sized to the devices with rows, the configuration in
        .rodata, the owner programs loaded only with owners."""
        n = len(self.rows)
        for name, size in (
            ("slots", n * 2 * (SLOT_SECTORS + 1)),
            ("dones", n * DONE_OPS),
            ("wowners", n * OWNER_OPS),
            *lat_arrays(n).items(),
        ):
            if so.bpf_map__set_max_entries(self._map(so, name), max(1, size)) != 0:
                raise _err(f"sizing {name}")
        cfg = Config(
            slot_devs=n,
            filter=1 if devs else 0,
            focus=focus,
            latency=self.latency_enabled,
            only=self._only,
        )
        for i, d in enumerate(self.rows):
            cfg.devs[i] = d
        rodata = self._rodata(so)
        held = ctypes.c_size_t(0)
        so.bpf_map__initial_value(rodata, ctypes.byref(held))
        if held.value != ctypes.sizeof(Config):
            raise IotuneError(
                f"{OBJECT}: .rodata holds {held.value} bytes, not the {ctypes.sizeof(Config)} "
                "of its configuration",
                hint="rebuild it with bpf/build.sh",
            )
        if so.bpf_map__set_initial_value(rodata, ctypes.byref(cfg), ctypes.sizeof(cfg)) != 0:
            raise _err("setting the configuration")
        for label, name in [*PROGRAMS, FORK]:
            prog = so.bpf_object__find_program_by_name(self._obj, name.encode())
            if not prog:
                raise IotuneError(f"{OBJECT} has no program {name}", hint=HINT)
            event = label.split(":")[1]
            wanted = owners or event in BTF_EVENTS
            wanted = wanted and (self.latency_enabled or event != "block_rq_insert")
            so.bpf_program__set_autoload(prog, wanted)
            if wanted:
                self._progs[label] = prog

    def _put_cgroup(self, so: Any, path: str | None) -> None:
        """The cgroup of the filter into slot 0 of ``only_cgroup``."""
        fd = self._fd(so, "only_cgroup")
        with cgroup_fd(path) as cg:
            key, value = ctypes.c_uint32(0), ctypes.c_uint32(cg)
            if so.bpf_map_update_elem(fd, ctypes.byref(key), ctypes.byref(value), 0):
                raise not_a_cgroup(path, os.strerror(ctypes.get_errno()))

    def _map(self, so: Any, name: str) -> Any:
        m = so.bpf_object__find_map_by_name(self._obj, name.encode())
        if not m:
            raise IotuneError(f"{OBJECT} has no map {name}", hint="rebuild it with bpf/build.sh")
        return m

    def _rodata(self, so: Any) -> Any:
        m = so.bpf_object__next_map(self._obj, None)
        while m:
            if so.bpf_map__name(m).endswith(b".rodata"):
                return m
            m = so.bpf_object__next_map(self._obj, m)
        raise IotuneError(f"{OBJECT} has no .rodata", hint="rebuild it with bpf/build.sh")

    def _fd(self, so: Any, name: str) -> int:
        return int(so.bpf_map__fd(self._map(so, name)))

    def _attach(self, label: str) -> None:
        link = lib().bpf_program__attach(self._progs[label])
        if not link:
            raise _err(f"attaching {label}")
        self._links[label] = link

    # ------------------------------------------------------------------ maps
    def _items(self, name: str) -> list[tuple[Any, Any]]:
        so, fd = lib(), self._fds[name]
        key_t, val_t = MAP_TYPES[name]
        out = []
        prev: Any = None  # NULL: the first key
        while so.bpf_map_get_next_key(fd, prev, ctypes.byref(key := key_t())) == 0:
            val = val_t()
            if so.bpf_map_lookup_elem(fd, ctypes.byref(key), ctypes.byref(val)) == 0:
                out.append((key, val))
            prev = ctypes.byref(key)
        return out

    def _map_fd(self, name: str) -> int:
        return self._fds[name]

    def _array_u64(self, name: str, index: int) -> int:
        val = ctypes.c_uint64()
        key = ctypes.c_uint32(index)
        if lib().bpf_map_lookup_elem(self._fds[name], ctypes.byref(key), ctypes.byref(val)):
            raise _err(f"reading {name}[{index}]")
        return int(val.value)

    def _update(self, name: str, key: Any, value: Any) -> None:
        if lib().bpf_map_update_elem(self._fds[name], ctypes.byref(key), ctypes.byref(value), 0):
            raise _err(f"updating {name}")

    # ------------------------------------------------------------------ programs
    def programs(self) -> list[tuple[str, int]]:
        """(event, program fd) of the attached programs' events."""
        so = lib()
        return [(label, int(so.bpf_program__fd(prog))) for label, prog in self._progs.items()]

    def switch(self, on: bool, events: Any = None) -> None:
        """Detach the block event programs (``on`` False) or attach them again, the maps and
        counts kept; ``events`` (``block_rq_issue`` …) switches just these."""
        known = [label.split(":")[1] for label in self._progs]
        if events is not None and (isinstance(events, str) or not set(events) <= set(known)):
            raise ValueError(f"not events of the programs: {events!r} (they: {known})")
        for label in list(self._progs):
            event = label.split(":")[1]
            if not label.startswith("block:") or (events is not None and event not in events):
                continue
            link = self._links.get(label)
            if not on and link:
                lib().bpf_link__destroy(link)
                self._links[label] = None
            elif on and not link:
                self._attach(label)

    def close(self) -> None:
        self._unmap()
        so = lib()  # loaded: the constructor's first step
        for link in self._links.values():
            if link:
                so.bpf_link__destroy(link)
        self._links = {}
        if getattr(self, "_obj", None):
            so.bpf_object__close(self._obj)
        self._obj = None
        self._progs = {}
        self._fds = {}
