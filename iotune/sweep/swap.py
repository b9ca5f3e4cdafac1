"""A sweep's swap rehearsal: DeepSpeed's optimizer swapping for one preset (its sub-groups,
files and order) timed at one aio configuration with the real async_io op
(:mod:`iotune.workers.aio_swap`), kept in ``RUN/swap.jsonl``. The step-time prediction
takes its read and write bandwidth before the plain file bandwidth of the sweep's points:
in DeepSpeed's pattern (many files, reads alternating with writes, a footprint of the
whole optimizer state) a drive can run slower than on one file."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from iotune.errors import UsageError
from iotune.records import SWAP_REHEARSALS as SWAP
from iotune.records import append_record
from iotune.records import swap_rehearsals as records
from iotune.sweep.runner import SweepSpec, run_worker
from iotune.workers.aio_swap import DIR_PREFIX

CONFIG_KEYS = ("block_size", "queue_depth", "threads", "single_submit", "overlap_events")


def plan(
    preset_name: str, aio: dict[str, Any], sets: tuple[str, ...] = ()
) -> tuple[dict[str, Any], int]:
    """The worker's input for *preset_name* (with the --set overrides *sets*) at the aio
    block *aio*, and the bytes its files take on the target. Refuses a preset whose
    optimizer state is not on NVMe."""
    from iotune.model.dsconfig import ds_config
    from iotune.model.presets import preset_with
    from iotune.model.swapfiles import swap_layout

    preset = preset_with(preset_name, sets)
    cfg = ds_config(preset, aio=aio)
    layout = swap_layout(preset, cfg)
    if not any(s for s, _ in layout):
        raise UsageError(
            f"--swap-pattern {preset_name}: its optimizer state is not swapped to NVMe",
            hint="name a preset with the optimizer on NVMe, e.g. opt_nvme_1b",
        )
    config = {
        "block_size": int(aio["block_size"]),
        "queue_depth": int(aio.get("queue_depth", 8)),
        "threads": int(aio.get("intra_op_parallelism", 1)),
        "single_submit": bool(aio.get("single_submit", False)),
        "overlap_events": bool(aio.get("overlap_events", True)),
    }
    space = sum(12 * s + 4 * sum(gs) for s, gs in layout)
    return {"preset": preset_name, "sets": list(sets), **config, "layout": layout}, space


def config_of(aio: dict[str, Any]) -> dict[str, Any]:
    return {k: aio[k] for k in CONFIG_KEYS}


def find(
    run_dir: Path, preset_name: str, config: dict[str, Any], sets: tuple[str, ...] = ()
) -> dict[str, Any] | None:
    """The finished rehearsal of *preset_name* (with *sets*) at *config* in *run_dir*, if any."""
    for r in records(run_dir):
        if (
            r.get("status") == "ok"
            and r["preset"] == preset_name
            and r.get("sets", []) == list(sets)
            and config_of(r) == config
        ):
            return r
    return None


def rehearse(
    run_dir: Path, target: Path, point: dict[str, Any], rounds: int, timeout_s: float
) -> dict[str, Any]:
    """Run the rehearsal in a fresh process, append its record (ok or failed) to
    ``RUN/swap.jsonl`` and return it. Its files are removed whatever happens."""
    rec: dict[str, Any] = {k: v for k, v in point.items() if k != "layout"}
    rec["target"] = str(target)
    rec["rounds_asked"] = rounds
    t0 = time.monotonic()
    try:
        run_worker(
            "iotune.workers.aio_swap",
            {**point, "target": str(target), "rounds": rounds},
            timeout_s,
            rec,
        )
    finally:
        for d in target.glob(f"{DIR_PREFIX}*"):
            shutil.rmtree(d, ignore_errors=True)
    rec["wall_s"] = round(time.monotonic() - t0, 3)
    rec["time"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    append_record(run_dir / SWAP, rec)
    return rec


def check_room(spec: SweepSpec) -> None:
    """--swap-pattern names a preset whose optimizer is on NVMe, and its files fit on the
    sweep's target (with 5% to spare)."""
    from iotune.model.presets import preset_with
    from iotune.units import GIB

    preset = preset_with(spec.swap_preset or "", spec.swap_sets)
    aio = preset.aio or {"block_size": min(spec.space.block_size)}
    _, need = plan(spec.swap_preset or "", aio, spec.swap_sets)
    free = shutil.disk_usage(spec.target).free
    if free < need * 1.05:
        raise UsageError(
            f"--swap-pattern {spec.swap_preset} writes {need / GIB:.1f} GiB of swap files, "
            f"{spec.target} has {free / GIB:.1f} GiB free",
            hint="free space on the volume, or name a smaller preset",
        )
