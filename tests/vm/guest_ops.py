"""DeepSpeed's CPU ops built on the host for the vm guest's CPU.

The guest is QEMU TCG with ``-cpu max``: AVX2 and FMA, no AVX-512. DeepSpeed's JIT build
compiles with ``-march=native`` and picks its SIMD width from py-cpuinfo, so ops built on
an AVX-512 host die with SIGILL in the guest, and a build inside the guest takes an hour of
emulated compiler. So the ops are built here, for x86-64-v3, into a folder of their own
that the guest reads through the shared directory: a ``c++`` wrapper in ``CXX`` turns
``-march=native`` into ``-march=x86-64-v3``, and a ``cpuinfo`` module on ``PYTHONPATH``
reports AVX2 (DeepSpeed then writes ``-D__AVX256__``). The guest runs with the same three
variables, so its ``build.ninja`` is this one and ninja finds nothing to do. The folder
lies in the virtualenv (``var/vm-guest-ops``), so that ccache (which torch puts in front
of the compiler where it is installed) finds a new virtualenv's objects where an earlier
one compiled them (iotune.workers.compiler_cache); the guest mounts it read-write (torch
takes a lock file there).

    python -m tests.vm.guest_ops DIR     # build (minutes), print the environment as JSON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from iotune.proc import worker_env
from tests.progress import following, wait_busy

OPS = ("CPUAdamBuilder", "AsyncIOBuilder", "ShareMemCommBuilder")

CXX = """#!/bin/sh
# DeepSpeed's -march=native, for the vm guest's CPU (QEMU TCG -cpu max: AVX2, no AVX-512);
# and no debug information (DeepSpeed's -g), which nothing in the guest reads: each object
# compiles in about four fifths of the time (a large one 36 against 47 CPU s), and is a
# fifth of the size. What it does is part of its -v, which ccache hashes as the compiler's
# identity (CCACHE_COMPILERCHECK below): an object another version of it built is not reused
[ "$*" = "-v" ] && echo "iotune guest c++: -march=native as x86-64-v3, no -g" >&2
for a do
  shift
  case "$a" in
    -march=native) set -- "$@" "-march=x86-64-v3" ;;
    -g) ;;
    *) set -- "$@" "$a" ;;
  esac
done
exec c++ "$@"
"""

CPUINFO = '''"""py-cpuinfo's answer for the vm guest's CPU (AVX2, no AVX-512)."""


def get_cpu_info():
    return {
        "arch": "X86_64",
        "flags": ["avx", "avx2", "fma", "f16c", "sse4_2"],
        "brand_raw": "QEMU TCG guest",
        "vendor_id_raw": "GenuineIntel",
    }
'''


#: torch's CPU kernels for the guest's processes: the baseline (SSE4.2) ones, not AVX2. QEMU's
#: TCG runs the AVX2 and FMA kernels torch and MKL pick for ``-cpu max`` through slow helpers,
#: and their second OpenMP thread spins: in one guest on a quiet host, the lab's model's
#: forward and backward (hidden 256, vocab 4096, 2 tokens) took 1.03 s a step and 1.93 s of
#: CPU with AVX2, 0.57 s and 1.14 s of CPU with these (benchmarks/RESULTS.md, 2026-11-30).
#: DeepSpeed's ops keep their AVX2 build (CXX, CPUINFO above). And torch's compiler off:
#: nothing the lab runs compiles, but DeepSpeed's Muon optimizer, which deepspeed.initialize
#: imports (the zygote with it), wraps functions in torch.compile as it is imported, and that
#: imports the inductor (a fifth of the zygote's imports). And torch's OpenMP threads asleep
#: as soon as they wait (OMP_WAIT_POLICY=PASSIVE), not an emulated spin first. Both were
#: tried on 2026-11-30 and taken out when the study's 4-drive prediction went past its bound
#: in that run (+16.2%); the cause was QEMU's throttle, which let a short phase's requests
#: through at once, and the drives have been throttled by the guest's block layer since
#: (cec8b76; benchmarks/RESULTS.md, 2026-12-01)
TORCH_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "TORCHDYNAMO_DISABLE": "1",
    "OMP_WAIT_POLICY": "PASSIVE",
}


def default_dir() -> Path:
    return Path(sys.prefix) / "var" / "vm-guest-ops"


def guest_env(top: Path) -> dict[str, str]:
    """The variables a process needs to build or load the guest's ops under *top*."""
    return {
        "CXX": str(top / "bin" / "c++"),
        "PYTHONPATH": str(top / "shim"),
        "TORCH_EXTENSIONS_DIR": str(top / "torch_extensions"),
        "DS_ACCELERATOR": "cpu",
    }


def build(top: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Build (or find built) the ops under *top*, in *environ* (default: this process's);
    the guest's environment for them."""
    base = dict(os.environ if environ is None else environ)
    top = top.resolve()  # ninja runs the compiler from the op's own folder
    (top / "bin").mkdir(parents=True, exist_ok=True)
    (top / "shim").mkdir(parents=True, exist_ok=True)
    cxx = top / "bin" / "c++"
    cxx.write_text(CXX)
    cxx.chmod(0o755)
    (top / "shim" / "cpuinfo.py").write_text(CPUINFO)
    env = guest_env(top)
    # ccache checks a compiler by its mtime: the wrapper written above is new in every
    # virtualenv, so it would never find an earlier one's objects. Its -v output names the
    # compiler it runs instead.
    check = {} if "CCACHE_COMPILERCHECK" in base else {"CCACHE_COMPILERCHECK": "%compiler% -v"}
    # as the guest's workers run (iotune.proc.worker_env): the same PATH, so the same ninja,
    # or the guest's first worker finds a build log it cannot read and builds every op again
    # on its emulated CPU (tens of minutes)
    build_env = {**base, **worker_env(), **env, **check}
    script = (
        "from deepspeed.accelerator import get_accelerator\n"
        "from deepspeed.ops.op_builder import CPUAdamBuilder, AsyncIOBuilder\n"
        "CPUAdamBuilder().load(); AsyncIOBuilder().load()\n"
        "get_accelerator().create_op_builder('ShareMemCommBuilder').load()\n"
    )
    t0 = time.monotonic()
    log = top / "build.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", script],
            env=build_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    # its own session, so that its compilers' CPU can be counted, at the calling thread's
    # priority, which it follows while it runs: the set-up's nice 19 until a test takes the
    # set-up (tests/vm/guest.Early), then the tests' or the study's. Left at 19 beside two
    # nice-0 loops, a build of 4 s (its objects in ccache) had not ended after 90 s; in a
    # `.ci/run` the study's lab, which boots after it, used no CPU until 32 minutes in
    follow = following(proc.pid)

    def built() -> bool:
        follow()
        return proc.poll() is not None

    # minutes where the compiler cache is cold: waited on while its compilers work, not
    # against a clock
    try:
        wait_busy(proc, built, "the guest's DeepSpeed op build", log)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"building the guest's DeepSpeed ops failed:\n{tail}")
    sys.stderr.write(f"guest ops ready in {time.monotonic() - t0:.0f} s under {top}\n")
    return env


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]))))
