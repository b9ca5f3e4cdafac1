"""A node's CPUs, for the planner: its cores and memory bandwidth from a datasheet
(``configs/cpus.toml``) or from the figures a user gives, and CPU Adam fitted to them where
the node's ranks step their optimizers side by side. Pure (the table is read from a file).

CPU Adam with R ranks on one node (:func:`fit_adam`), each rank stepping its share of the
parameters at once:

- its threads: each rank gets ``cores // R`` of the node's cores. Where that is fewer than the
  threads CPU Adam was measured at, its time is scaled by measured / given threads: linear,
  the most it can cost (the study's own curve gains less than that from more threads);
- the node's memory: CPU Adam is memory-bandwidth bound (the study: "6 P-cores saturate the
  dual-channel DDR5 bandwidth"), so R ranks at once take at least R x share x ``k`` /
  bandwidth, where ``k`` is the study's Adam step at saturation times its memory's
  theoretical bandwidth (:func:`adam_bytes`: about 56 bytes of the theoretical bandwidth per
  parameter, what Adam reads and writes and what the memory does not deliver of its rating).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from iotune.errors import UsageError
from iotune.paths import data_dir
from iotune.units import parse_quantity

if TYPE_CHECKING:
    from iotune.plan.measured import AdamRate

#: the study's workstation, whose thread table calibrates the memory bound
STUDY_CPU = "intel-core-i5-14600k"
_KEYS = ("cores", "channels", "mts", "sockets", "memory")
_EXAMPLE = "cores=64,channels=12,mts=4800"


@dataclass(frozen=True)
class CpuSpec:
    """A node's CPUs: ``sockets`` of one processor (or of the figures given)."""

    key: str  # the table's name, or "--cpu" for figures given
    name: str
    cores: int  # one socket's
    memory_bw: float  # one socket's, theoretical, bytes/s
    source: str
    sockets: int = 1
    channels: int | None = None
    mts: int | None = None
    avx512: bool | None = None

    @property
    def node_cores(self) -> int:
        return self.cores * self.sockets

    @property
    def node_memory_bw(self) -> float:
        return self.memory_bw * self.sockets

    def describe(self) -> str:
        """``2 x amd-epyc-9654: 192 cores, 24 channels of 4800 MT/s, 921.6 GB/s (theoretical)``."""
        mem = (
            f"{self.channels * self.sockets} channels of {self.mts} MT/s, "
            if self.channels and self.mts
            else ""
        )
        return (
            f"{self.sockets} x {self.key if self.key != '--cpu' else self.name}: "
            f"{self.node_cores} cores, {mem}{self.node_memory_bw / 1e9:.1f} GB/s (theoretical)"
        )


def _int(text: object, key: str) -> int:
    try:
        value = int(str(text))
    except ValueError:
        value = 0
    if value <= 0:
        raise UsageError(
            f"--cpu {key}={text!r} is not a positive whole number", hint=f"e.g. --cpu {_EXAMPLE}"
        )
    return value


def _bandwidth(channels: int, mts: int) -> float:
    """Theoretical: each channel moves 8 bytes per transfer."""
    return channels * mts * 1e6 * 8


def load_cpus(path: Path | None = None) -> dict[str, CpuSpec]:
    """The CPU table, one socket each."""
    p = path or data_dir("configs") / "cpus.toml"
    try:
        with p.open("rb") as fh:
            doc = tomllib.load(fh)
        out = {}
        for key, row in doc["cpu"].items():
            channels, mts = int(row["channels"]), int(row["mts"])
            out[key] = CpuSpec(
                key,
                str(row["name"]),
                int(row["cores"]),
                _bandwidth(channels, mts),
                str(row["source"]),
                channels=channels,
                mts=mts,
                avx512=bool(row["avx512"]) if "avx512" in row else None,
            )
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise UsageError(
            f"cannot read the CPU profiles in {p}: {exc}", hint="reinstall iotune"
        ) from exc
    return out


def parse_cpu(text: str, path: Path | None = None) -> CpuSpec:
    """``--cpu NAME[,sockets=N]``, or the figures: ``cores=C`` with ``channels=K,mts=M`` or
    ``memory=RATE`` (one socket's), ``sockets=N``. A name not in the table is refused with
    the names it holds and how to give the figures."""
    name: str | None = None
    fields: dict[str, str] = {}
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq:
            if name is not None:
                raise UsageError(
                    f"--cpu {text!r} names two CPUs", hint="one name, e.g. --cpu amd-epyc-9654"
                )
            name = part.lower()
        elif key not in _KEYS:
            raise UsageError(
                f"--cpu {text!r}: unknown figure {key!r}",
                hint=f"the figures are {', '.join(_KEYS)}, e.g. --cpu {_EXAMPLE}",
            )
        elif key in fields:
            raise UsageError(f"--cpu {text!r} gives {key} twice", hint=f"e.g. --cpu {_EXAMPLE}")
        else:
            fields[key] = value.strip()
    sockets = _int(fields.pop("sockets"), "sockets") if "sockets" in fields else 1
    if name is not None:
        table = load_cpus(path)
        if name not in table:
            raise UsageError(
                f"--cpu {name!r} is not in iotune's CPU table ({', '.join(sorted(table))})",
                hint=f"give its figures instead: --cpu {_EXAMPLE},sockets=2 (cores and memory "
                "channels of one socket, the DIMMs' MT/s), or memory=460.8GB/s for the bandwidth",
            )
        if fields:
            raise UsageError(
                f"--cpu {text!r}: a named CPU takes only sockets=",
                hint=f"--cpu {name},sockets=2, or its figures alone: --cpu {_EXAMPLE}",
            )
        return replace(table[name], sockets=sockets)
    if "cores" not in fields or not ("memory" in fields or {"channels", "mts"} <= set(fields)):
        raise UsageError(
            f"--cpu {text!r} needs cores and the memory (channels and mts, or memory)",
            hint=f"e.g. --cpu {_EXAMPLE}, or a name from configs/cpus.toml",
        )
    if "memory" in fields and ("channels" in fields or "mts" in fields):
        raise UsageError(
            f"--cpu {text!r} gives the memory twice (memory= and channels/mts)",
            hint="one of them: memory=460.8GB/s, or channels=12,mts=4800",
        )
    cores = _int(fields["cores"], "cores")
    if "memory" in fields:
        bw = parse_quantity(
            fields["memory"], what="--cpu memory=", rate=True, example="memory=460.8GB/s"
        )
        return CpuSpec("--cpu", f"a CPU of {cores} cores", cores, bw, "--cpu", sockets=sockets)
    channels, mts = _int(fields["channels"], "channels"), _int(fields["mts"], "mts")
    return CpuSpec(
        "--cpu",
        f"a CPU of {cores} cores",
        cores,
        _bandwidth(channels, mts),
        "--cpu",
        sockets=sockets,
        channels=channels,
        mts=mts,
    )


def adam_bytes(study_adam: AdamRate, study_cpu: CpuSpec) -> float:
    """Bytes of theoretical memory bandwidth one parameter's CPU Adam step takes where its
    threads saturate the memory: the study's step at its thread count (where its table says
    the memory is saturated) times its memory's theoretical bandwidth."""
    return study_adam.seconds_per_param * study_cpu.node_memory_bw


def cores_per_rank(cpu: CpuSpec, ranks: int) -> int:
    """The node's cores each of *ranks* ranks gets; refuses more ranks than cores."""
    r = max(1, ranks)
    if cpu.node_cores < r:
        raise UsageError(
            f"{r} ranks on a node of {cpu.node_cores} cores ({cpu.describe()}): CPU Adam needs a "
            "core a rank",
            hint="fewer ranks a node (--ranks), or the node's sockets (--cpu NAME,sockets=2)",
        )
    return cpu.node_cores // r


def fit_adam(adam: AdamRate, cpu: CpuSpec, ranks: int, k: float) -> AdamRate:
    """CPU Adam's seconds per parameter of a rank's share where *ranks* ranks step at once on
    *cpu*'s node: at the threads each gets (the measured rate, or scaled linearly where each
    gets fewer threads than it was measured at), and no faster than the node's memory lets
    *ranks* x the share through at *k* bytes a parameter. Refuses more ranks than cores."""
    r = max(1, ranks)
    each = cores_per_rank(cpu, r)
    threads = min(each, adam.threads)
    spp = adam.seconds_per_param * adam.threads / threads
    memory = k * r / cpu.node_memory_bw
    why = [f"CPU Adam on {cpu.describe()}: {each} core(s) a rank of {r}"]
    if threads < adam.threads:
        why.append(
            f"{threads} thread(s) a rank where CPU Adam was measured at {adam.threads}: its "
            f"time scaled by {adam.threads}/{threads}, the most it can cost"
        )
    bound = memory > spp * (1 + 1e-9)  # on the study's own node its bound is its measure
    if bound:
        why.append(
            f"bound by the node's memory: {r} rank(s) at once, {k:.0f} bytes of its bandwidth a "
            f"parameter (the study's Adam where its memory saturates), {memory * 1e9:.3f} s a "
            f"billion parameters a rank against {spp * 1e9:.3f} s at its threads"
        )
    label = adam.source_label or adam.source
    return replace(
        adam,
        seconds_per_param=max(spp, memory),
        threads=threads,
        note="; ".join(filter(None, [adam.note, *why])),
        source_label=f"{label}; bound by the node's memory" if bound else label,
    )


def node_adam(adam: AdamRate | None, cpu: CpuSpec, ranks: int) -> AdamRate | None:
    """``estimate --cpu``: CPU Adam fitted to *cpu*'s node with *ranks* ranks (fit_adam), the
    memory bound's bytes a parameter from the study's table and workstation; None stays None,
    and a rate timed with *ranks* ranks at once (sweep-threads --ranks) stays as timed.
    Refuses more ranks than cores even where CPU Adam was not measured."""
    from iotune.plan.measured import study_adam

    if adam is None:
        cores_per_rank(cpu, ranks)
        return None
    if adam.ranks == ranks > 1:
        # timed with the node's ranks side by side: their share of the cores and the memory
        # is in the figure already
        each = cores_per_rank(cpu, ranks)
        why = (
            f"CPU Adam timed with {ranks} ranks at once ({adam.source}), not fitted to "
            f"{cpu.describe()} ({each} core(s) a rank)"
        )
        return replace(adam, note="; ".join(filter(None, [adam.note, why])))
    ref = study_adam()
    k = adam_bytes(ref, load_cpus()[STUDY_CPU]) if ref is not None else 0.0
    return fit_adam(adam, cpu, ranks, k)
