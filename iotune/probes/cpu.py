"""Does this CPU compute bf16 natively? x86 needs AVX-512 BF16 or AMX (``avx512_bf16``,
``amx_bf16`` in /proc/cpuinfo), Arm the BF16 extension (``bf16``). Without them torch and
oneDNN emulate bf16 matrix products through float32 conversions, about 50x slower than float32
itself on an AVX2 host (measured: a tiny Llama's backward 36 s in bf16, 0.7 s in float32).

oneDNN's ``ONEDNN_MAX_CPU_ISA`` caps the instructions it uses: a cap below AVX512_CORE_BF16
(e.g. ``AVX2``) makes bf16 emulated on any CPU, and is honoured here as such.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass

from iotune.probes.sysfs import SysTree

#: the cpuinfo flags that make bf16 arithmetic native
X86_BF16 = ("avx512_bf16", "amx_bf16")
ARM_BF16 = ("bf16",)
#: ONEDNN_MAX_CPU_ISA values that keep bf16 instructions (oneDNN's cpu_isa names)
_ISA_WITH_BF16 = ("ALL", "DEFAULT", "BF16", "AMX", "FP16", "AVX10")


@dataclass(frozen=True)
class Bf16Support:
    native: bool
    found: tuple[str, ...]  # the bf16 flags found (empty: none)
    simd: tuple[str, ...]  # the widest vector flags found, for the record (avx2, avx512f)
    why: str  # one line a user reads

    def to_dict(self) -> dict[str, object]:
        return {
            "native": self.native,
            "found": list(self.found),
            "simd": list(self.simd),
            "why": self.why,
        }


def cpu_flags(tree: SysTree) -> set[str]:
    """The first processor's flags (x86 ``flags``, Arm ``Features``)."""
    text = tree.read_raw("/proc/cpuinfo") or ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def bf16_support(
    tree: SysTree | None = None,
    env: Mapping[str, str] | None = None,
    machine: str | None = None,
) -> Bf16Support:
    """Whether bf16 runs natively here, with the flags that say so."""
    tree = tree or SysTree("/")
    env = os.environ if env is None else env
    arch = machine or platform.machine()
    flags = cpu_flags(tree)
    wanted = ARM_BF16 if arch in ("aarch64", "arm64") else X86_BF16
    found = tuple(f for f in wanted if f in flags)
    simd = tuple(f for f in ("avx2", "avx512f", "asimd", "sve") if f in flags)
    cap = env.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if found and cap and not any(k in cap for k in _ISA_WITH_BF16):
        return Bf16Support(
            False,
            found,
            simd,
            f"emulated: ONEDNN_MAX_CPU_ISA={cap} caps oneDNN below bf16 instructions "
            f"(the CPU has {', '.join(found)})",
        )
    if found:
        return Bf16Support(True, found, simd, f"native ({', '.join(found)})")
    has = ", ".join(simd) or "no vector flags read"
    return Bf16Support(
        False, (), simd, f"emulated: {has}, no {' or '.join(wanted)} in /proc/cpuinfo"
    )
