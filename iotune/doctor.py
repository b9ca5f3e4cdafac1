"""`iotune doctor`: is this host ready? Each check reports PASS/WARN/FAIL, what it found and
the exact fix, and names the command families (raid, sweep, trace, train) that need it.
"""

from __future__ import annotations

import ctypes.util
import os
import platform
import re
import resource
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from iotune import proc

# the checks other commands make too live in iotune.checks; the doctor shows them all
from iotune.checks import (
    ALL,
    Check,
    Family,
    Status,
    check_bcc,
    check_block_tracepoint,
    import_bcc,
    probe_torch,
    tracefs_dir,
)
from iotune.errors import IotuneError, NotRootError, last_line
from iotune.paths import bpf_source
from iotune.probes.cpu import bf16_support
from iotune.probes.meminfo import meminfo
from iotune.probes.sysfs import SysTree
from iotune.units import GIB


def check_root() -> Check:
    if os.geteuid() == 0:
        return Check("root", Status.PASS, "running as root", needed_by=ALL - {Family.TRAIN})
    return Check(
        "root",
        Status.FAIL,
        f"running as uid {os.geteuid()}",
        "run as root (sudo): probes open block devices, BPF needs CAP_BPF/CAP_SYS_ADMIN",
        ALL - {Family.TRAIN},
    )


def check_kernel() -> Check:
    release = platform.release()
    m = re.match(r"(\d+)\.(\d+)", release)
    version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if version < (5, 4):
        return Check(
            "kernel", Status.WARN, f"{release}: older than 5.4", "a 5.4+ kernel is tested", ALL
        )
    return Check("kernel", Status.PASS, release)


def check_btf(tree: SysTree) -> Check:
    """Whether trace can use its BTF tracepoint programs: the kernel's BTF has the fields they
    read and its block tracepoints pass the arguments they expect (5.11 and later)."""
    from iotune.trace.bpf import btf_cflags
    from iotune.trace.btf import Btf, BtfError

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


def _tool_version(tool: str, args: list[str], pattern: str) -> str | None:
    if proc.which(tool) is None:
        return None
    try:
        done = proc.run([tool, *args], check=False, timeout=20)
    except IotuneError:
        return None
    m = re.search(pattern, done.stdout + done.stderr)
    return m.group(1) if m else (done.stdout + done.stderr).strip().splitlines()[0]


def check_tool(
    tool: str, package: str, args: list[str], pattern: str, needed: set[Family]
) -> Check:
    version = _tool_version(tool, args, pattern)
    if version is None:
        return Check(
            tool, Status.FAIL, "not installed", f"apt-get install {package}", frozenset(needed)
        )
    return Check(tool, Status.PASS, f"{proc.which(tool)} {version}", needed_by=frozenset(needed))


def check_md(tree: SysTree) -> Check:
    families = frozenset({Family.RAID})
    mdstat = tree.read("/proc/mdstat")
    if mdstat and "[raid0]" in mdstat:
        return Check("md raid0", Status.PASS, "raid0 personality loaded", needed_by=families)
    release = platform.release()
    for listing in (
        f"/lib/modules/{release}/modules.dep",
        f"/lib/modules/{release}/modules.builtin",
    ):
        text = tree.read_raw(listing) or ""
        if re.search(r"(^|/)raid0\.ko", text, re.M):
            how = "built in" if listing.endswith("builtin") else "module available (modprobe raid0)"
            return Check("md raid0", Status.PASS, how, needed_by=families)
    return Check(
        "md raid0",
        Status.FAIL,
        f"the running kernel {release} has no md raid0 driver",
        "boot a kernel with CONFIG_MD_RAID0 (e.g. the distribution kernel); "
        "'iotune raid' cannot build arrays here",
        families,
    )


def check_libaio(tree: SysTree) -> Check:
    families = frozenset({Family.SWEEP, Family.TRAIN})
    lib = ctypes.util.find_library("aio")
    # the compiler's own include path, then what the environment adds to it (DeepSpeed's
    # op builder compiles with the same environment)
    dirs = ["/usr/include", "/usr/local/include"]
    for var in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH"):
        dirs += [d for d in os.environ.get(var, "").split(":") if d]
    header = next((f"{d}/libaio.h" for d in dirs if Path(d, "libaio.h").exists()), None)
    if lib and header:
        return Check("libaio", Status.PASS, f"{lib}, {header}", needed_by=families)
    missing = "library" if not lib else "header (libaio.h)"
    return Check(
        "libaio",
        Status.FAIL,
        f"{missing} missing",
        "apt-get install libaio-dev (DeepSpeed builds its async_io op against it)",
        families,
    )


def checks_from_torch(info: dict[str, Any]) -> list[Check]:
    out: list[Check] = []
    train = frozenset({Family.TRAIN})
    if info.get("worker_error"):
        out.append(
            Check(
                "torch",
                Status.FAIL,
                info["worker_error"],
                "run with --debug",
                train | {Family.SWEEP},
            )
        )
        return out
    if not info.get("torch"):
        out.append(
            Check(
                "torch",
                Status.FAIL,
                "not installed",
                "pip install 'iotune[train]' (scripts/setup.sh picks a CPU build on hosts "
                "without a GPU)",
                train | {Family.SWEEP},
            )
        )
        return out
    out.append(
        Check("torch", Status.PASS, f"torch {info['torch']}", needed_by=train | {Family.SWEEP})
    )
    gpus = info.get("gpus") or []
    if gpus:
        desc = "; ".join(f"{g['name']} ({g['memory_bytes'] / GIB:.1f} GiB)" for g in gpus)
        out.append(Check("GPU", Status.PASS, f"CUDA {info.get('cuda')}: {desc}"))
    else:
        out.append(
            Check(
                "GPU",
                Status.WARN,
                "no CUDA GPU visible to torch",
                "training runs use the CPU presets (tiny_*) with DS_ACCELERATOR=cpu",
            )
        )
    if not info.get("deepspeed"):
        out.append(
            Check(
                "DeepSpeed",
                Status.FAIL,
                info.get("deepspeed_error", "not installed"),
                "pip install 'iotune[train]'",
                train | {Family.SWEEP},
            )
        )
        return out
    out.append(
        Check(
            "DeepSpeed",
            Status.PASS,
            f"deepspeed {info['deepspeed']} (accelerator {info.get('accelerator')})",
            needed_by=train | {Family.SWEEP},
        )
    )
    aio = info.get("aio") or {}
    if aio.get("loaded"):
        out.append(
            Check("async_io op", Status.PASS, "built and loaded", needed_by=train | {Family.SWEEP})
        )
    elif aio.get("error"):
        out.append(
            Check(
                "async_io op",
                Status.FAIL,
                f"build/load failed: {aio['error']}",
                "install libaio-dev and a C++ compiler; run 'iotune --debug doctor --build-ops'",
                train | {Family.SWEEP},
            )
        )
    elif aio.get("compatible"):
        out.append(
            Check(
                "async_io op",
                Status.PASS,
                (
                    "buildable; built for another DeepSpeed install, so the first use rebuilds it"
                    if aio.get("stale")
                    else "buildable, not built yet"
                )
                + " (the first sweep or run JIT-builds it: a few minutes, once)",
                "iotune doctor --build-ops builds it now",
                train | {Family.SWEEP},
            )
        )
    else:
        out.append(
            Check(
                "async_io op",
                Status.FAIL,
                "DeepSpeed reports async_io incompatible with this host",
                "apt-get install libaio-dev g++",
                train | {Family.SWEEP},
            )
        )
    if aio.get("build_dir_error"):
        # without its build directory nothing says whether the op is cached: the first run
        # may build it (minutes), or fail to write the build
        out.append(
            Check(
                "op cache",
                Status.WARN,
                f"cannot inspect the op build directory: {aio['build_dir_error']}",
                "set TORCH_EXTENSIONS_DIR to a writable directory, or run "
                "'iotune doctor --build-ops'",
                train | {Family.SWEEP},
            )
        )
    return out


def check_bf16(tree: SysTree, info: dict[str, Any]) -> Check:
    """Does the CPU compute bf16 natively? The CPU presets train in bf16 where it does and in
    float32 where it is emulated (about 50x slower); the cost torch measured is shown."""
    cpu = bf16_support(tree)
    seen = info.get("cpu_bf16") or {}
    cost = seen.get("bf16_cost")
    measured = f"; a bf16 matmul + backward took {cost}x float32's time" if cost else ""
    if cpu.native:
        return Check("bf16 (CPU)", Status.PASS, f"{cpu.why}: CPU presets train in bf16{measured}")
    return Check(
        "bf16 (CPU)",
        Status.PASS,
        f"{cpu.why}: CPU presets train in float32 (bf16 is emulated here{measured})",
        "forcing it (--set dtype=bf16) is allowed, at that cost",
    )


def check_memory(tree: SysTree) -> Check:
    avail = meminfo(tree).get("MemAvailable")
    if avail is None:
        return Check("free RAM", Status.WARN, "MemAvailable not found in /proc/meminfo")
    gib = avail / GIB
    if gib < 8:
        return Check(
            "free RAM",
            Status.WARN,
            f"{gib:.1f} GiB available",
            "offloaded training keeps gradients and pinned buffers in RAM: only tiny presets fit",
        )
    return Check("free RAM", Status.PASS, f"{gib:.1f} GiB available")


def check_memlock() -> Check:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if os.geteuid() == 0:
        return Check("ulimit -l", Status.PASS, "root: CAP_IPC_LOCK, pinned memory is not limited")
    if soft == resource.RLIM_INFINITY:
        return Check("ulimit -l", Status.PASS, "unlimited")
    return Check(
        "ulimit -l",
        Status.WARN,
        f"{soft // 1024} KiB of locked memory",
        "raise it for pinned AIO buffers: 'ulimit -l unlimited' or memlock in limits.conf",
    )


def run_checks(
    tree: SysTree, *, build_ops: bool = False, torch_info: dict[str, Any] | None = None
) -> list[Check]:
    checks: list[Check] = [
        check_root(),
        check_kernel(),
        check_btf(tree),
        check_libbpf(),
        check_libbpf_load(tree),
        check_tracefs(tree),
        check_block_tracepoint(tree),
        check_headers(tree),
        check_bcc(),
        check_bpf_load(tree),
        check_tool("mdadm", "mdadm", ["--version"], r"(v[\d.]+)", {Family.RAID}),
        check_tool("mkfs.xfs", "xfsprogs", ["-V"], r"version ([\d.]+)", {Family.RAID}),
        check_tool("wipefs", "util-linux", ["--version"], r"([\d.]+)", {Family.RAID}),
        check_md(tree),
        check_tool("fio", "fio", ["--version"], r"fio-([\d.]+)", {Family.SWEEP}),
        check_libaio(tree),
    ]
    info = torch_info if torch_info is not None else probe_torch(build_ops, bf16_cost=True)
    checks += checks_from_torch(info)
    checks += [check_bf16(tree, info), check_memory(tree), check_memlock()]
    return settle_tracer(checks)


def ready(checks: list[Check], family: Family) -> list[Check]:
    """The failed checks that *family* needs (empty: ready)."""
    return [c for c in checks if c.status is Status.FAIL and family in c.needed_by]


def missing(checks: list[Check]) -> dict[str, list[str]]:
    """For every family, the names of the failed checks it needs (an empty list: ready)."""
    return {f.value: [c.name for c in ready(checks, f)] for f in Family}


def apply_fixes(tree: SysTree) -> list[str]:
    """--fix: the safe fixes this host needs (mount tracefs), as the commands applied."""
    if tracefs_dir(tree) is not None:
        return []
    if os.geteuid() != 0:
        raise NotRootError("iotune doctor --fix")
    return [" ".join(fix_tracefs())]


def fix_tracefs() -> list[str]:
    """Mount tracefs (the only fix doctor applies itself: it changes nothing on disk)."""
    argv = ["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"]
    proc.run(argv, timeout=30)
    return argv
