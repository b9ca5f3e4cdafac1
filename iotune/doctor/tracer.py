"""The doctor's checks of the tracer: BTF, libbpf and a load of its CO-RE object, tracefs,
the kernel headers and a bcc load, and which of the two `iotune trace` will use."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import replace

# the checks other commands make too live in iotune.checks; the doctor shows them all
from iotune.checks import (
    Check,
    Family,
    Status,
    import_bcc,
    tracefs_dir,
)
from iotune.errors import IotuneError, last_line
from iotune.paths import bpf_source
from iotune.probes.sysfs import SysTree


def check_btf(tree: SysTree) -> Check:
    """Whether trace can use its BTF tracepoint programs: the kernel's BTF has the fields they
    read and its block tracepoints pass the arguments they expect (5.11 and later)."""
    from iotune.trace.btf import Btf, BtfError, btf_cflags

    if not tree.exists("/sys/kernel/btf/vmlinux"):
        return Check(
            "BTF",
            Status.WARN,
            "no /sys/kernel/btf/vmlinux: trace falls back to classic tracepoint programs",
            "optional: a kernel built with CONFIG_DEBUG_INFO_BTF=y spares each traced request "
            "the kernel's event record",
        )
    try:
        btf_cflags(Btf.vmlinux(tree.root / "sys/kernel/btf/vmlinux"), owners=True)
    except BtfError as exc:
        return Check(
            "BTF",
            Status.WARN,
            f"trace falls back to classic tracepoint programs: {exc}",
            "optional: the BTF programs need a kernel from 5.11 on",
        )
    return Check(
        "BTF", Status.PASS, "/sys/kernel/btf/vmlinux present (trace: BTF tracepoint programs)"
    )


def check_tracefs(tree: SysTree) -> Check:
    found = tracefs_dir(tree)
    if found:
        return Check(
            "tracefs", Status.PASS, f"mounted at {found}", needed_by=frozenset({Family.TRACE})
        )
    return Check(
        "tracefs",
        Status.FAIL,
        "not mounted",
        "mount -t tracefs nodev /sys/kernel/tracing   (or: iotune doctor --fix)",
        frozenset({Family.TRACE}),
    )


def check_headers(tree: SysTree) -> Check:
    release = platform.release()
    build = f"/lib/modules/{release}/build"
    if tree.exists(f"{build}/include"):
        target = tree.realpath(build)
        note = ""
        if release not in target:
            note = " (headers of another kernel: fine for iotune's programs, which take "
            note += "the kernel's layouts from its BTF or tracefs)"
        return Check(
            "kernel headers",
            Status.PASS,
            f"{build} -> {target}{note}",
            needed_by=frozenset({Family.TRACE}),
        )
    if tree.exists("/sys/kernel/kheaders.tar.xz"):
        return Check(
            "kernel headers",
            Status.PASS,
            "in-kernel headers (/sys/kernel/kheaders.tar.xz)",
            needed_by=frozenset({Family.TRACE}),
        )
    return Check(
        "kernel headers",
        Status.FAIL,
        f"no {build}",
        f"apt-get install linux-headers-{release}; if the kernel has no headers package, "
        "scripts/setup.sh links the distribution's headers (README: 'bcc on a kernel "
        "without its own headers')",
        frozenset({Family.TRACE}),
    )


def check_bpf_load(tree: SysTree) -> Check:
    """Compile, load and attach bpf/probe.bpf.c to block:block_rq_issue, then detach."""
    families = frozenset({Family.TRACE})
    if os.geteuid() != 0:
        return Check("BPF load", Status.FAIL, "not tried: needs root", "run as root", families)
    try:
        bcc = import_bcc()
    except ImportError:
        return Check("BPF load", Status.FAIL, "not tried: bcc missing", "see 'bcc'", families)
    source = bpf_source("probe.bpf.c")
    try:
        prog = bcc.BPF(src_file=str(source).encode())
        try:
            attached = prog.num_open_tracepoints()
        finally:
            prog.cleanup()
    except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception on compile or load errors
        last = last_line(str(exc)) or type(exc).__name__
        return Check(
            "BPF load",
            Status.FAIL,
            f"loading {source.name} failed: {last}",
            "check 'kernel headers' and 'tracefs' above; run with --debug for bcc's output",
            families,
        )
    return Check(
        "BPF load",
        Status.PASS,
        f"compiled, loaded and attached {source.name} ({attached} tracepoint), then detached",
        needed_by=families,
    )


#: what only the bcc tracer needs (with libbpf serving, their failures are warnings)
BCC_CHAIN = ("tracefs", "block tracepoints", "kernel headers", "bcc", "BPF load")
LIBBPF_CHAIN = ("libbpf", "libbpf load")


def check_libbpf() -> Check:
    from iotune.trace import libbpf

    families = frozenset({Family.TRACE})
    try:
        found = f"libbpf {libbpf.version()} ({libbpf.libbpf_path() or 'libbpf.so.1'})"
    except IotuneError as exc:
        return Check("libbpf", Status.FAIL, exc.message, "apt-get install libbpf1", families)
    return Check("libbpf", Status.PASS, found, needed_by=families)


def check_libbpf_load(tree: SysTree) -> Check:
    """Load bpf/reqsize.core.bpf.o through libbpf (CO-RE relocations against the kernel's
    BTF, the verifier), attach its block programs, then detach: what trace does first."""
    from iotune.trace.libbpf import OBJECT, LibbpfTracer

    families = frozenset({Family.TRACE})
    name = "libbpf load"
    if os.geteuid() != 0:
        return Check(name, Status.FAIL, "not tried: needs root", "run as root", families)
    if not tree.exists("/sys/kernel/btf/vmlinux"):
        return Check(
            name,
            Status.FAIL,
            "no /sys/kernel/btf/vmlinux: the CO-RE object needs the kernel's BTF",
            "a kernel built with CONFIG_DEBUG_INFO_BTF=y (most distribution kernels since "
            "2021); or bcc (see below)",
            families,
        )
    start = time.monotonic()
    try:
        tracer = LibbpfTracer(None)
        n = len(tracer.programs())
        tracer.close()
    except IotuneError as exc:
        return Check(name, Status.FAIL, exc.message, exc.hint, families)
    ms = (time.monotonic() - start) * 1000
    return Check(
        name,
        Status.PASS,
        f"loaded {OBJECT} (CO-RE, relocated to this kernel's BTF) and attached its {n} "
        f"tracepoint programs in {ms:.0f} ms, then detached",
        needed_by=families,
    )


def settle_tracer(checks: list[Check]) -> list[Check]:
    """trace needs one of its two eBPF tracers: libbpf (tried first) or bcc. Where one of
    them works, the other's failures are warnings that trace does not need; a last check
    says which tracer trace will use and why. Where neither works, both stay failures."""
    by = {c.name: c for c in checks}

    def ok(chain: tuple[str, ...]) -> bool:
        return all(by[n].status is not Status.FAIL for n in chain if n in by)

    libbpf_ok, bcc_ok = ok(LIBBPF_CHAIN), ok(BCC_CHAIN)
    spare: tuple[str, ...]
    if libbpf_ok:
        spare, note = BCC_CHAIN, "bcc, the fallback for kernels without BTF, is not needed"
        verdict = Check(
            "tracer",
            Status.PASS,
            "trace uses libbpf: its CO-RE object loads on this kernel (no compiler or "
            "headers at run time)",
            needed_by=frozenset({Family.TRACE}),
        )
    elif bcc_ok:
        spare, note = LIBBPF_CHAIN, "trace uses bcc"
        why = "; ".join(by[n].found for n in LIBBPF_CHAIN if by[n].status is Status.FAIL)
        verdict = Check(
            "tracer",
            Status.PASS,
            f"trace uses bcc: libbpf cannot ({why})",
            needed_by=frozenset({Family.TRACE}),
        )
    else:
        return [
            *checks,
            Check(
                "tracer",
                Status.FAIL,
                "neither libbpf nor bcc can trace: see their checks above",
                "fix either chain; without one, trace counts diskstats totals only",
                frozenset({Family.TRACE}),
            ),
        ]
    out = [
        replace(
            c,
            status=Status.WARN,
            found=f"{c.found} ({note})",
            needed_by=c.needed_by - {Family.TRACE},
        )
        if c.name in spare and c.status is Status.FAIL
        else c
        for c in checks
    ]
    return [*out, verdict]
