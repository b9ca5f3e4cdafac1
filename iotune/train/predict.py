"""Step time predicted from measurements: the I/O model's bytes per step over the bandwidth
`sweep-aio` measured on the target, plus the CPU-Adam time `sweep-threads` measured per
parameter, plus forward and backward from a baseline run. Pure, apart from reading the
sweeps' record files.

DeepSpeed's ZeRO-3 optimizer step with the optimizer state on NVMe (runtime/zero/stage3.py,
``_optimizer_step`` per sub-group, runtime/swap_tensor/partitioned_optimizer_swapper.py):
for each sub-group it swaps in the fp32 master, both Adam moments and the fp32 gradients
(12 bytes per parameter plus 4 per gradient element), runs CPU Adam on it, and swaps the
master and moments out (12 bytes); without ``pipeline_read``/``pipeline_write`` (iotune's
presets, DeepSpeed's default) these three phases do not overlap. The gradients were written
during backward (4 bytes per swapped gradient element), so that write belongs to the step
but not to the optimizer's time. Hence::

    optimizer = read(12 n_s + 4 n_g) / R + Adam(N) + write(12 n_s) / W
    step      = forward + backward (baseline) + write(4 n_g) / W + optimizer

R and W are the sweep's bandwidths at the run's aio block (block size, queue depth,
threads, single_submit, overlap_events): the median of every measurement of that
configuration. Adam(N) is the thread sweep's median step time scaled to N parameters
(CPU Adam is memory-bandwidth bound: time grows with N) at the run's thread count.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iotune.errors import UsageError
from iotune.records import SWAP_REHEARSALS, THREADS_RESULT, read_records, swap_rehearsals
from iotune.train.estimate import Estimate
from iotune.train.presets import Preset
from iotune.units import GIB, amount, binary_size


@dataclass(frozen=True)
class Bandwidth:
    """Read and write bandwidth (bytes/s) measured by a sweep at one aio configuration."""

    read: float
    write: float
    config: dict[str, Any]  # the configuration measured (may differ from the run's: note)
    samples: dict[str, int]  # measurements per op behind each median
    source: str
    note: str | None = None
    pattern: str = "file"  # "swap": measured in DeepSpeed's swapping pattern


@dataclass(frozen=True)
class AdamRate:
    """CPU-Adam seconds per parameter at a thread count, from a thread sweep."""

    seconds_per_param: float
    threads: int
    params: int
    source: str
    note: str | None = None


@dataclass(frozen=True)
class Baseline:
    """A measured run of the same size and accumulation with the optimizer state in RAM
    (opt_ram): its forward + backward, and its optimizer step (CPU Adam plus the bf16
    copy back to the GPU and the gradient norm: everything but the swapping)."""

    forward_backward_s: float
    optimizer_s: float | None
    source: str
    backward_s: float | None = None  # all micro-steps' backward, within forward_backward_s


@dataclass(frozen=True)
class Prediction:
    optimizer_s: float | None
    step_s: float | None
    terms: list[tuple[str, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "optimizer_s": None if self.optimizer_s is None else round(self.optimizer_s, 3),
            "step_s": None if self.step_s is None else round(self.step_s, 3),
            "terms": [{"what": w, "seconds": round(s, 3)} for w, s in self.terms],
            "notes": list(self.notes),
        }


# ------------------------------------------------------------------------- the sweeps' data


def _sweep_records(path: Path) -> tuple[list[dict[str, Any]], Path]:
    d = path if path.is_dir() else path.parent
    f = d / "points.jsonl"
    if not f.exists():
        raise UsageError(
            f"{path} is not a sweep-aio run directory (no points.jsonl)",
            hint="run 'iotune sweep-aio --target DIR --out RUN' on the offload drive, then pass RUN",
        )
    return [r for r in read_records(f) if r.get("status") == "ok"], f


def has_points(path: str | None) -> bool:
    """Whether --aio-config names a sweep with measurements (not just a DeepSpeed config)."""
    if not path:
        return False
    p = Path(path)
    return ((p if p.is_dir() else p.parent) / "points.jsonl").exists()


def _distance(r: dict[str, Any], aio: dict[str, Any]) -> tuple[float, ...]:
    return (
        abs(math.log2(r["block_size"] / aio["block_size"])),
        abs(math.log2(r["queue_depth"] / aio.get("queue_depth", 8))),
        abs(r["threads"] - int(aio.get("intra_op_parallelism", 1))),
        float(r["single_submit"] != bool(aio.get("single_submit", False))),
        float(r["overlap_events"] != bool(aio.get("overlap_events", True))),
    )


def swap_bandwidth(
    path: Path, aio: dict[str, Any], preset: str, swap_bytes: int
) -> Bandwidth | None:
    """The sweep's rehearsal of DeepSpeed's optimizer swapping (``sweep-aio --swap-pattern``)
    at exactly the run's aio block: the one that read this run's bytes per step (this
    preset's first), else the one whose bytes per step are nearest (with a note). None when
    the sweep has none at that block."""
    d = path if path.is_dir() else path.parent
    at = [r for r in swap_rehearsals(d) if r.get("status") == "ok" and not any(_distance(r, aio))]
    if not at:
        return None

    def same(r: dict[str, Any]) -> bool:  # the run's files (DeepSpeed pads each a little)
        return bool(abs(r["read_bytes"] - swap_bytes) <= 0.01 * swap_bytes)

    r = min(
        at,
        key=lambda r: (not same(r), r["preset"] != preset, abs(r["read_bytes"] - swap_bytes)),
    )
    note = (
        None
        if r["preset"] == preset and same(r)
        else f"bandwidth from the swap rehearsal of {r['preset']} "
        f"({r['read_bytes'] / GIB:.3f} GiB read per step, this run {swap_bytes / GIB:.3f})"
    )
    rounds = len(r["rounds"])
    return Bandwidth(
        r["read_bw_bytes_s"],
        r["write_bw_bytes_s"],
        {
            op: {k: r[k] for k in ("block_size", "queue_depth", "threads")}
            for op in ("read", "write")
        },
        {"read": rounds, "write": rounds},
        f"{d / SWAP_REHEARSALS} ({r['preset']}'s optimizer swapping)",
        note,
        pattern="swap",
    )


def aio_bandwidth(path: Path, aio: dict[str, Any]) -> Bandwidth:
    """The sweep's read and write bandwidth at ``aio`` (the run's block), or at the nearest
    configuration it measured for each op, with a note saying which."""
    records, f = _sweep_records(path)
    out: dict[str, float] = {}
    samples: dict[str, int] = {}
    notes = []
    config: dict[str, Any] = {}
    for op in ("read", "write"):
        mine = [r for r in records if r.get("op") == op]
        if not mine:
            raise UsageError(
                f"the sweep in {f.parent} measured no {op}s",
                hint="sweep both: iotune sweep-aio --ops read,write",
            )
        best = min(_distance(r, aio) for r in mine)
        at = [r for r in mine if _distance(r, aio) == best]
        values = [float(v) for r in at for v in (r.get("bw_bytes_s_all") or [r["bw_bytes_s"]])]
        out[op] = statistics.median(values)
        samples[op] = len(values)
        r0 = at[0]
        config[op] = {k: r0[k] for k in ("block_size", "queue_depth", "threads")}
        if any(best):
            notes.append(
                f"{op}s: the sweep has no point at the run's aio block; nearest "
                f"{binary_size(r0['block_size'])} qd {r0['queue_depth']} "
                f"{r0['threads']} thread(s)"
            )
    return Bandwidth(out["read"], out["write"], config, samples, str(f), "; ".join(notes) or None)


def adam_rate(path: Path, threads: int) -> AdamRate:
    """CPU-Adam seconds per parameter at ``threads`` (or the nearest count the sweep timed)."""
    f = path / THREADS_RESULT if path.is_dir() else path
    try:
        doc = json.loads(f.read_text())
        rows = [r for r in doc["rows"] if r.get("status") == "ok"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(
            f"--threads-config {path}: not a sweep-threads result ({exc})",
            hint="run 'iotune sweep-threads --out RUN', then pass RUN",
        ) from exc
    if not rows:
        raise UsageError(
            f"--threads-config {path}: no thread count ran",
            hint="see the errors in its threads.json",
        )
    row = min(rows, key=lambda r: (abs(int(r["threads"]) - threads), int(r["threads"])))
    note = (
        None
        if int(row["threads"]) == threads
        else f"CPU Adam timed at {row['threads']} thread(s), the run uses {threads}"
    )
    return AdamRate(
        float(row["step_ms_median"]) / 1000 / int(row["params"]),
        int(row["threads"]),
        int(row["params"]),
        str(f),
        note,
    )


# ------------------------------------------------------------------------------ the model


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 10**9 else f"{n / 1e6:.1f}M"


def predict(
    preset: Preset,
    est: Estimate,
    bw: Bandwidth | None,
    adam: AdamRate | None,
    base: Baseline | None = None,
) -> Prediction:
    """Optimizer and step time of one steady step (module docstring). Pure."""
    s = preset.strategy
    notes: list[str] = []
    if s.zenflow:
        return Prediction(
            None,
            None,
            notes=["ZenFlow overlaps the CPU update with the next steps' GPU work: not modelled"],
        )
    if s.optimizer == "gpu":
        return Prediction(None, None, notes=["no offload: nothing the drives or CPU Adam bound"])
    if s.params == "nvme" and s.optimizer != "nvme":
        return Prediction(
            None,
            None,
            notes=["parameters on NVMe with the optimizer state elsewhere: not modelled"],
        )
    sw = est.swapped
    terms: list[tuple[str, float]] = []
    cpu = base is not None and base.optimizer_s is not None and s.optimizer == "nvme"
    if cpu and base and base.optimizer_s is not None:
        # the RAM run's optimizer step is this step without the swapping
        adam_s = base.optimizer_s
        adam_what = f"optimizer step without swapping ({base.source})"
    elif adam is not None:
        if adam.note:
            notes.append(adam.note)
        adam_s = adam.seconds_per_param * est.params
        adam_what = f"CPU Adam, {_count(est.params)} parameters at {adam.threads} thread(s)"
    else:
        return Prediction(
            None,
            None,
            notes=["CPU Adam not measured: pass --threads-config (or --baseline)"],
        )
    if s.optimizer == "nvme":
        if bw is None:
            return Prediction(None, None, notes=["no AIO bandwidth: pass --aio-config SWEEP_RUN"])
        if bw.note:
            notes.append(bw.note)
        rd = 12 * sw.n_s + 4 * sw.n_g
        wr = 12 * sw.n_s
        how = " (swap rehearsal)" if bw.pattern == "swap" else ""
        terms.append((f"read {amount(rd)} at {amount(bw.read, '/s')}{how}", rd / bw.read))
        terms.append((adam_what, adam_s))
        terms.append((f"write {amount(wr)} at {amount(bw.write, '/s')}{how}", wr / bw.write))
        # parameters on NVMe too: the step writes the updated parameters back (the I/O
        # model's steady write beyond the optimizer state and the gradients)
        back = max(0, est.steady_step.write - wr - 4 * sw.n_g)
        if back:
            terms.append(
                (
                    f"write {amount(back)} of updated parameters at {amount(bw.write, '/s')}{how}",
                    back / bw.write,
                )
            )
    else:
        terms.append((adam_what, adam_s))
    optimizer = sum(t for _, t in terms)
    step = None
    if base is not None:
        step = base.forward_backward_s + optimizer
        terms.append((f"forward + backward ({base.source})", base.forward_backward_s))
        # parameters on NVMe: forward, the recomputation and backward fetch them (the I/O
        # model's steady read beyond the optimizer's), each fetch waited for on a CPU run
        fetch = max(0, est.steady_step.read - (12 * sw.n_s + 4 * sw.n_g))
        if s.optimizer == "nvme" and bw is not None and fetch:
            step += fetch / bw.read
            terms.append(
                (
                    f"read {amount(fetch)} of parameters in forward + backward at "
                    f"{amount(bw.read, '/s')}{how}",
                    fetch / bw.read,
                )
            )
        grads = 4 * sw.n_g if s.optimizer == "nvme" and bw is not None else 0
        if grads and bw:
            # DeepSpeed writes each gradient partition asynchronously as the last micro-step's
            # backward produces it: the writing hides behind that backward, and what is left
            # of it lengthens the step
            hidden = (base.backward_s or 0.0) / preset.ga
            extra = max(0.0, grads / bw.write - hidden)
            step += extra
            terms.append(
                (
                    f"gradients written in backward, {amount(grads)} in "
                    f"{grads / bw.write:.2f} s, beyond the {hidden:.2f} s of backward it "
                    "overlaps",
                    extra,
                )
            )
    else:
        notes.append("step time needs forward + backward: pass --baseline RUN (e.g. opt_ram)")
    return Prediction(optimizer, step, terms, notes)


def load_run(path: Path) -> dict[str, Any]:
    f = path / "run.json" if path.is_dir() else path
    try:
        doc = json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"{path}: not an iotune run ({exc})",
            hint="name a run directory written by 'iotune run' or 'iotune trace --run'",
        ) from exc
    if not isinstance(doc, dict) or "preset" not in doc:
        raise UsageError(f"{f}: not an iotune run document", hint="name a run directory")
    return doc


def run_threads(p: Preset) -> int:
    """The OpenMP threads CPU Adam runs with: the preset's, else every CPU this process may
    use (OpenMP's default)."""
    return int(p.cpu_threads or len(os.sched_getaffinity(0)))


def measured_inputs(
    preset: Preset,
    cfg: dict[str, Any],
    aio_config: str | None,
    threads_config: str | None,
    baseline: str | None,
) -> tuple[Bandwidth | None, AdamRate | None, Baseline | None]:
    """The measurements a prediction is made from, as named on the command line: the
    sweep's bandwidth at the run's aio block, CPU Adam's rate at the run's thread count,
    and a baseline run's forward + backward (each None when not given)."""
    from iotune.train.results import backward_median, forward_backward, optimizer_median

    aio = cfg.get("aio") or preset.aio
    bw = None
    if aio_config and has_points(aio_config) and preset.strategy.uses_nvme and aio:
        from iotune.train.estimate import swapped_counts
        from iotune.train.presets import base_name

        sw = swapped_counts(preset, cfg)
        bw = swap_bandwidth(
            Path(aio_config), aio, base_name(preset.name), 12 * sw.n_s + 4 * sw.n_g
        ) or aio_bandwidth(Path(aio_config), aio)
    adam = adam_rate(Path(threads_config), run_threads(preset)) if threads_config else None
    base = None
    if baseline:
        doc = load_run(Path(baseline))
        fb = forward_backward(doc)
        if fb is None:
            raise UsageError(
                f"--baseline {baseline}: the run has no finished step",
                hint="name a run that finished at least one step",
            )
        base = Baseline(
            fb, optimizer_median(doc), f"{doc['preset']}, measured", backward_median(doc)
        )
    return bw, adam, base
