"""What a prediction is made from, read from the records the user names: a sweep's
bandwidth at the run's aio block, a thread sweep's CPU Adam, a baseline run's forward +
backward (and, from a run whose optimizer state was on NVMe, the drives it swapped to and CPU
Adam without the swaps), the seed study's own figures for its presets, or a drive's
datasheet. Each input says where it came from; :mod:`iotune.plan.predict` does the
arithmetic.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iotune.errors import UsageError
from iotune.model.presets import Preset
from iotune.plan.rundoc import (
    backward_median,
    forward_backward,
    load_run,
    optimizer_median,
    swap_medians,
    volume_drives,
)
from iotune.records import SWAP_REHEARSALS, THREADS_RESULT, read_threads
from iotune.sweep import space as sp
from iotune.sweep.run import SweepRun, has_points
from iotune.units import GIB, binary_size


@dataclass(frozen=True)
class Bandwidth:
    """Read and write bandwidth (bytes/s) of the target: measured by a sweep at one aio
    configuration, by a run's own swaps, or a datasheet's derated."""

    read: float
    write: float
    config: dict[str, Any]  # the configuration measured (may differ from the run's: note)
    samples: dict[str, int]  # measurements per op behind each median
    source: str
    note: str | None = None
    pattern: str = "file"  # "swap": DeepSpeed's swapping rehearsed; "run"; "datasheet"
    derate: tuple[float, float] | None = None  # a datasheet's factors, read and write

    @property
    def how(self) -> str:
        """What the prediction's lines add to the rate: where it was not a plain sweep."""
        if self.pattern == "swap":
            return "swap rehearsal"
        if self.pattern == "run":
            return f"swaps of {self.source}"
        if self.pattern == "datasheet" and self.derate:
            return f"datasheet x {self.derate[0]:.2f} read, x {self.derate[1]:.2f} write"
        return ""


@dataclass(frozen=True)
class AdamRate:
    """CPU-Adam seconds per parameter at a thread count, from a thread sweep (or the study)."""

    seconds_per_param: float
    threads: int
    params: int
    source: str
    note: str | None = None
    source_label: str | None = None  # said beside the figure where it was not measured here
    ranks: int = 1  # ranks that stepped at once where it was timed (sweep-threads --ranks)


@dataclass(frozen=True)
class Baseline:
    """Forward + backward of a run of the same model and batch, and its optimizer step
    without swapping where it tells it: a RAM run's whole optimizer step, an NVMe run's
    without the seconds its swaps took (what is left is CPU Adam and its copies)."""

    forward_backward_s: float
    optimizer_s: float | None
    source: str
    backward_s: float | None = None  # what of forward_backward_s the gradients' writes overlap
    adam_source: str | None = None  # where optimizer_s comes from, where not from source
    kind: str = "ram"  # ram, nvme, gpu (the baseline run's strategy), study


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
    sweep = SweepRun.load(path)
    d = sweep.dir
    at = [r for r in sweep.rehearsals() if not any(_distance(r, aio))]
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
    sweep = SweepRun.load(path)
    records, f = sweep.ok, sweep.points_file
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
        out[op] = sp.pooled(at)
        samples[op] = sum(len(sp.measurements(r)) for r in at)
        r0 = at[0]
        config[op] = {k: r0[k] for k in ("block_size", "queue_depth", "threads")}
        if any(best):
            notes.append(
                f"{op}s: the sweep has no point at the run's aio block; nearest "
                f"{binary_size(r0['block_size'])} qd {r0['queue_depth']} "
                f"{r0['threads']} thread(s)"
            )
    return Bandwidth(out["read"], out["write"], config, samples, str(f), "; ".join(notes) or None)


def adam_rate(path: Path, threads: int, ranks: int = 1) -> AdamRate:
    """CPU-Adam seconds per parameter at ``threads`` (or the nearest count the sweep timed),
    with ``ranks`` ranks stepping at once where the sweep timed that many side by side
    (``sweep-threads --ranks``), else as one rank alone, said in its note."""
    f = path / THREADS_RESULT if path.is_dir() else path
    doc = read_threads(path)
    if doc is None:
        raise UsageError(
            f"--threads-config {path}: not a sweep-threads result",
            hint="run 'iotune sweep-threads --out RUN', then pass RUN",
        )
    ok = [r for r in doc["rows"] if isinstance(r, dict) and r.get("status") == "ok"]
    if not ok:
        raise UsageError(
            f"--threads-config {path}: no thread count ran",
            hint="see the errors in its threads.json",
        )
    timed = sorted({int(r.get("ranks") or 1) for r in ok})
    at = ranks if ranks in timed else min(timed, key=lambda k: (abs(k - ranks), k))
    rows = [r for r in ok if int(r.get("ranks") or 1) == at]
    row = min(rows, key=lambda r: (abs(int(r["threads"]) - threads), int(r["threads"])))
    notes = []
    if int(row["threads"]) != threads:
        notes.append(f"CPU Adam timed at {row['threads']} thread(s), the run uses {threads}")
    if at != ranks:
        notes.append(
            f"CPU Adam timed with {at} rank(s) at once, the run has {ranks} (sweep-threads "
            f"--ranks {ranks} times them side by side)"
        )
    return AdamRate(
        float(row["step_ms_median"]) / 1000 / int(row["params"]),
        int(row["threads"]),
        int(row["params"]),
        str(f),
        "; ".join(notes) or None,
        ranks=at,
    )


def run_threads(p: Preset) -> int:
    """The OpenMP threads CPU Adam runs with: the preset's, else every CPU this process may
    use (OpenMP's default)."""
    return int(p.cpu_threads or len(os.sched_getaffinity(0)))


# ------------------------------------------------------------------ runs as baselines


@dataclass(frozen=True)
class RunDrives:
    """What a run whose optimizer state was on NVMe measured of its volume: the bandwidth of
    its swaps (the bytes the I/O model gives over the seconds the worker timed them), and the
    drives behind it."""

    read: float  # bytes/s of the volume
    write: float
    drives: int
    source: str

    def per_drive(self) -> Bandwidth:
        """One drive's share (RAID0 stripes every swap evenly over its members)."""
        k = self.drives
        return Bandwidth(
            self.read / k,
            self.write / k,
            {},
            {"read": 1, "write": 1},
            self.source,
            pattern="run",
        )


def _swapped(doc: dict[str, Any]) -> tuple[int, int, int, int]:
    """(n_s, n_g, steady read, steady write) of a run's own estimate (bytes on the node)."""
    est = doc.get("estimate") or {}
    sw = est.get("swapped") or {}
    steady = est.get("steady_step") or {}
    k = max(1, int(doc.get("ranks") or 1))
    return (
        int(sw.get("n_s") or 0) * k,
        int(sw.get("n_g") or 0) * k,
        int(steady.get("read") or 0),
        int(steady.get("write") or 0),
    )


def run_drives(doc: dict[str, Any], path: str) -> RunDrives | None:
    """The bandwidth a run's swaps had: reads are the state and gradients swapped in
    (``swap_in_s`` without its wait for the gradients), writes the gradients and the state
    swapped out (``grad_out_s + backward_grad_out_s + grad_flush_s + swap_out_s``). None
    where its steps carry no swap timings."""
    sm = swap_medians(doc)
    n_s, n_g, _, _ = _swapped(doc)
    if sm is None or not (n_s or n_g):
        return None
    reading = sm["swap_in_s"] - sm["grad_flush_s"]
    writing = sm["grad_out_s"] + sm["backward_grad_out_s"] + sm["grad_flush_s"] + sm["swap_out_s"]
    if reading <= 0 or writing <= 0:
        return None
    moved = 12 * n_s + 4 * n_g
    k = volume_drives(doc)
    return RunDrives(
        moved / reading,
        moved / writing,
        k,
        f"{doc['preset']} ({path}, {k} drive{'s' if k > 1 else ''})",
    )


def run_baseline(doc: dict[str, Any], path: str) -> Baseline:
    """A run as the baseline of a prediction: its forward + backward, and, where it tells
    it, its optimizer step without swapping.

    - optimizer state in RAM (opt_ram): the whole optimizer step is CPU Adam and its copies;
    - on NVMe: the optimizer step without the seconds its swaps took; with the parameters on
      NVMe too, forward + backward without their fetches and the optimizer step without the
      updated parameters' writes, at the bandwidth its swaps had. Its gradients were written
      at the accumulation boundary (the swap timings hold them), so none hide behind backward;
    - everything on the GPU: forward + backward only."""
    fb = forward_backward(doc)
    if fb is None:
        raise UsageError(
            f"--baseline {path}: the run has no steady step (none after its first, which "
            "carries the first update's extra work)",
            hint="name a run of 2 steps or more (iotune run ... --steps 3)",
        )
    strategy = str(doc.get("strategy") or "")
    source = f"{doc['preset']}, measured"
    if "nvme" not in strategy and "raid" not in strategy:
        gpu = strategy.startswith("gpu")
        return Baseline(
            fb,
            None if gpu else optimizer_median(doc),
            source,
            backward_median(doc),
            kind="gpu" if gpu else "ram",
        )
    sm = swap_medians(doc)
    drives = run_drives(doc, path)
    if sm is None or drives is None:
        return Baseline(fb, None, source, backward_median(doc), kind="nvme")
    n_s, n_g, steady_read, steady_write = _swapped(doc)
    fetch = max(0, steady_read - (12 * n_s + 4 * n_g))
    back = max(0, steady_write - 12 * n_s - 4 * n_g)
    # forward + backward without what the drives made it wait: the parameters' fetches, and
    # the gradients' writes where DeepSpeed does them at the end of backward
    compute = max(0.0, fb - fetch / drives.read - sm["backward_grad_out_s"])
    adam = max(0.0, sm["rest_s"] - back / drives.write)
    waits = [
        w
        for w, t in (
            ("the parameters' fetches", fetch),
            ("the gradients' writes", sm["backward_grad_out_s"]),
        )
        if t
    ]
    what = f"forward + backward without {' and '.join(waits)}" if waits else None
    return Baseline(
        round(compute, 4),
        round(adam, 4),
        f"{doc['preset']}, measured" + (f": {what}" if what else ""),
        0.0,
        adam_source=f"{doc['preset']}, measured: its optimizer step less its swaps",
        kind="nvme",
    )


# ------------------------------------------------------------------ the study's figures


def study_inputs(preset: Preset) -> tuple[Baseline, AdamRate] | None:
    """For the seed study's own model (its 16B rows): forward + backward from its measured
    step less its optimizer step, and CPU Adam at its thread count from its 2B thread table,
    scaled to the parameters (CPU Adam's time grows with them). The study's step holds what
    its gradients' writes added beyond backward on its drive, so the prediction lets them
    overlap all of it. Parameters on NVMe take the optimizer-only row's figure: the same
    model and batch, whose forward + backward fetched nothing from the drive."""
    from iotune.model.presets import preset_with
    from iotune.model.published import study_row

    opt_only = preset_with(f"opt_nvme_{preset.size}", ()) if preset.size else None
    row = study_row(opt_only) if opt_only is not None and preset.ga == 1 else None
    if row is None or row.step_s is None or row.optimizer_s is None:
        return None
    adam = study_adam()
    if adam is None:
        return None
    fb = row.step_s - row.optimizer_s
    base = Baseline(
        round(fb, 4),
        None,
        f"the study's '{row.case}' row: step {row.step_s} s less optimizer {row.optimizer_s} s",
        round(fb, 4),
        kind="study",
    )
    return base, adam


def study_adam() -> AdamRate | None:
    """CPU Adam at the study's largest thread count, from its thread table (the 2B model with
    the optimizer state in RAM): where its memory is saturated (its text says so)."""
    from iotune.model.presets import preset_with
    from iotune.model.published import load_study

    threads = load_study().get("adam_threads") or {}
    sizes, times = threads.get("threads") or [], threads.get("optimizer_ms") or []
    if not sizes:
        return None
    n_small = preset_with(f"opt_ram_{threads['size']}", ()).geometry.param_count()
    t, ms = sizes[-1], float(times[-1])
    return AdamRate(
        ms / 1000 / n_small,
        int(t),
        n_small,
        "configs/study.toml [study.adam_threads]",
        source_label=f"the study's {threads['size'].upper()} at {t} threads: {ms:.0f} ms",
    )


def datasheet_bandwidth(spec: Any, derate: Any) -> Bandwidth:
    """One drive's bandwidth as its datasheet gives it, derated to what DeepSpeed reaches."""
    return Bandwidth(
        spec.read * derate.read,
        spec.write * derate.write,
        {},
        {"read": 0, "write": 0},
        f"{spec.label} datasheet",
        pattern="datasheet",
        derate=(derate.read, derate.write),
    )


def measured_inputs(
    preset: Preset,
    cfg: dict[str, Any],
    aio_config: str | None,
    threads_config: str | None,
    baseline: str | None,
) -> tuple[Bandwidth | None, AdamRate | None, Baseline | None]:
    """The measurements a prediction is made from, as named on the command line: the
    sweep's bandwidth at the run's aio block, CPU Adam's rate at the run's thread count,
    and a baseline's forward + backward (each None when not given). ``--baseline study``
    takes the seed study's figures for its own model."""
    aio = cfg.get("aio") or preset.aio
    bw = None
    if aio_config and has_points(aio_config) and preset.strategy.uses_nvme and aio:
        from iotune.model.presets import base_name
        from iotune.model.swapfiles import swapped_counts

        sw = swapped_counts(preset, cfg)
        bw = swap_bandwidth(
            Path(aio_config), aio, base_name(preset.name), 12 * sw.n_s + 4 * sw.n_g
        ) or aio_bandwidth(Path(aio_config), aio)
    adam = (
        adam_rate(Path(threads_config), run_threads(preset), max(1, preset.ranks))
        if threads_config
        else None
    )
    base = None
    if baseline == STUDY:
        got = study_inputs(preset)
        if got is None:
            raise UsageError(
                f"--baseline study: the study measured no step of {preset.name}'s model",
                hint="the study's figures are those of its 16B rows (opt_nvme_16b, "
                "params_opt_nvme_16b, at accumulation 1); name a run of yours instead",
            )
        base, study_adam = got
        adam = adam or study_adam
    elif baseline:
        base = run_baseline(load_run(Path(baseline)), baseline)
    return bw, adam, base


#: ``--baseline study``: the seed study's own figures
STUDY = "study"
