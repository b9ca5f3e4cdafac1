"""Advice on a DeepSpeed config: where a setting costs something another value would save,
with the figure. Pure over the estimate and sysfs; shown by `iotune estimate` (and in its
--json) for presets and for --ds-config alike."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iotune.model.dsconfig import DEFAULT_AIO_BLOCK, model_element_size
from iotune.model.estimate import Estimate, estimate
from iotune.model.presets import Preset
from iotune.probes.sysfs import SysTree
from iotune.units import amount, format_size

#: pinned swap buffers worth a word: below this the saving is noise on any training host
PINNED_WORTH = 1 << 30
#: the sub_group_size suggested where the whole model is one sub-group (DeepSpeed's own
#: examples use 1e8 to 1e9 for large models)
SMALLER_SUBGROUP = 100_000_000


@dataclass(frozen=True)
class Advice:
    setting: str
    text: str
    saves_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.setting, "text": self.text, "saves_bytes": self.saves_bytes}


def advise(
    p: Preset,
    cfg: dict[str, Any],
    est: Estimate,
    tree: SysTree | None = None,
    aio_config: str | None = None,
) -> list[Advice]:
    out: list[Advice] = [Advice(k, text) for k, text in p.ds_notes]
    out += _subgroup(p, cfg, est)
    out += _param_buffers(p, cfg)
    out += _block_vs_queue(cfg, p.nvme_path, tree or SysTree("/"))
    if aio_config and p.ds_user and isinstance(p.deepspeed.get("aio"), dict):
        out += _swept_block(p.deepspeed["aio"], Path(aio_config))
    return out


def _point_key(aio: dict[str, Any]) -> tuple[int, int, int, bool, bool]:
    """A DeepSpeed aio block as a sweep's configuration (iotune.sweep.space.config_of)."""
    return (
        int(aio.get("block_size", DEFAULT_AIO_BLOCK)),
        int(aio.get("queue_depth", 8)),
        int(aio.get("intra_op_parallelism", aio.get("threads", 1))),
        bool(aio.get("single_submit", False)),
        bool(aio.get("overlap_events", True)),
    )


def _swept_block(mine: dict[str, Any], sweep: Path) -> list[Advice]:
    """Your config's aio block against the sweep of the drive (--aio-config SWEEP_RUN): its
    measured bandwidth beside the sweep's best, where the sweep measured it. Both by the
    sweep's own rule (iotune.sweep.space: the points that succeeded, a configuration's
    median over every measurement of it); a point marked failed never counts."""
    from iotune.sweep import space as sp
    from iotune.sweep.run import SweepRun, has_points

    if not has_points(sweep):
        return []
    run = SweepRun.load(sweep)
    best = run.best_per_op()
    key = _point_key(mine)
    yours = {op: bw for op in ("read", "write") if (bw := run.bandwidth_at(op, key)) is not None}
    if set(yours) != {"read", "write"} or not {"read", "write"} <= set(best):
        return []
    top = {op: float(best[op]["bw_bytes_s"]) for op in ("read", "write")}
    slower = {op: 1 - yours[op] / top[op] for op in ("read", "write")}
    if max(slower.values()) < 0.05:
        return []
    bs, qd, th, ss, oe = sp.config_of(best["read"])
    return [
        Advice(
            "aio",
            f"your aio block (block {format_size(int(mine.get('block_size', DEFAULT_AIO_BLOCK)))}, "
            f"queue depth {mine.get('queue_depth', 8)}) read {amount(yours['read'], '/s')} "
            f"and wrote {amount(yours['write'], '/s')} in {sweep}, "
            f"{slower['read']:.0%} and {slower['write']:.0%} below its best: read "
            f"{amount(top['read'], '/s')} (block {format_size(bs)}, queue depth {qd}, "
            f"{th} thread(s), single_submit {str(ss).lower()}, overlap_events "
            f"{str(oe).lower()}), write {amount(top['write'], '/s')}; the estimate's times "
            "use the sweep's block",
        )
    ]


def _subgroup(p: Preset, cfg: dict[str, Any], est: Estimate) -> list[Advice]:
    """The optimizer's swap buffers pin buffer_count x 4 bytes x the largest sub-group: with
    a sub_group_size above the model every buffer holds the whole model's fp32 state."""
    zo = cfg.get("zero_optimization", {})
    off = zo.get("offload_optimizer", {}) or {}
    if off.get("device") != "nvme":
        return []
    size = int(zo.get("sub_group_size", 1_000_000_000))
    if est.host is None or est.host.swap_buffers < PINNED_WORTH or size <= SMALLER_SUBGROUP:
        return []
    pinned = est.host.swap_buffers
    smaller = {**cfg, "zero_optimization": {**zo, "sub_group_size": SMALLER_SUBGROUP}}
    host = estimate(p, smaller).host
    other = host.swap_buffers if host is not None else pinned
    if pinned - other < pinned // 4:
        return []
    return [
        Advice(
            "zero_optimization.sub_group_size",
            f"sub_group_size {size:,} pins {amount(pinned)} of optimizer swap buffers "
            f"({off.get('buffer_count', 4)} x the largest sub-group's fp32 state); "
            f"{SMALLER_SUBGROUP:,} would pin {amount(other)} and swap the same bytes per step",
            pinned - other,
        )
    ]


def _param_buffers_needed(tensors: list[tuple[str, int]], keep: int, reuse: int) -> tuple[int, int]:
    """How many offload_param swap buffers DeepSpeed may hold at once, as (with the reuse
    distance `reuse`, with 0). One buffer holds one parameter's partition; the parameters
    at or below stage3_param_persistence_threshold (`keep`) never swap. A module's
    parameters come in one swap-in and are released only after the next module's arrive, so
    two modules' worth are the least; after use a parameter is kept (buffer and all)
    while it comes back within max_reuse_distance elements of the trace
    (partitioned_param_coordinator.py): with the default 1e9 that is every swapped parameter
    of a model below it, which stays resident from its forward to its backward. An upper
    bound: a tiny GPT-NeoX with 8 swapped parameters ran with 6 buffers and failed with 5
    (DeepSpeed 0.19.8); with stage3_max_reuse_distance 0 it ran with 2 and failed with 1."""
    swapped = [n > keep for _, n in tensors]
    modules = Counter(
        name.rsplit(".", 1)[0] for (name, _), s in zip(tensors, swapped, strict=True) if s
    )
    least = 2 * max(modules.values(), default=0)
    # the most swapped parameters in any stretch of the trace within `reuse` elements
    most = held = numel = start = 0
    for i, (_, n) in enumerate(tensors):
        numel += n
        held += swapped[i]
        while numel > reuse and start <= i:
            numel -= tensors[start][1]
            held -= swapped[start]
            start += 1
        most = max(most, held)
    return max(least, most), least


def _param_buffers(p: Preset, cfg: dict[str, Any]) -> list[Advice]:
    """offload_param's buffer_count below what DeepSpeed may hold at once: it stops mid-step
    with "Not enough buffers" after minutes of start-up."""
    zo = cfg.get("zero_optimization", {})
    op = zo.get("offload_param") or {}
    if not isinstance(op, dict) or op.get("device") != "nvme":
        return []
    count = int(op.get("buffer_count", 5))
    keep = int(zo.get("stage3_param_persistence_threshold", 100_000))
    reuse = int(zo.get("stage3_max_reuse_distance", 1_000_000_000))
    need, without_reuse = _param_buffers_needed(p.geometry.tensors(), keep, reuse)
    if count >= need:
        return []
    each = model_element_size(cfg) * int(op.get("buffer_size", 100_000_000))
    return [
        Advice(
            "zero_optimization.offload_param.buffer_count",
            f"offload_param.buffer_count {count} may be too few: DeepSpeed can hold up to {need} "
            f"parameters' swap buffers at once (stage3_max_reuse_distance {reuse:,} keeps the "
            "parameters above stage3_param_persistence_threshold from forward to backward) and "
            "stops mid-step with 'Not enough buffers'; buffer_count "
            f"{need} pins {amount((need - count) * each)} more, or stage3_max_reuse_distance 0 "
            f"needs {without_reuse} and reads the parameters again in backward",
        )
    ]


def _block_vs_queue(cfg: dict[str, Any], nvme_path: str | None, tree: SysTree) -> list[Advice]:
    """An aio block above a drive's max_sectors_kb: the kernel splits every request."""
    block = int(cfg.get("aio", {}).get("block_size", DEFAULT_AIO_BLOCK))
    if not nvme_path or not Path(nvme_path).exists():
        return []
    from iotune.errors import IotuneError
    from iotune.trace.targets import resolve_path

    try:
        disks = resolve_path(tree, nvme_path).disks
    except (OSError, IotuneError):
        return []
    out = []
    for d in disks:
        kb = tree.read_int(f"/sys/block/{d}/queue/max_sectors_kb")
        if kb and block > kb * 1024:
            pieces = -(-block // (kb * 1024))
            out.append(
                Advice(
                    "aio.block_size",
                    f"aio block {format_size(block)} is above {d}'s max_sectors_kb ({kb}): "
                    f"the kernel splits every request into {pieces}; a block of "
                    f"{format_size(kb * 1024)} is issued whole (or raise max_sectors_kb up to "
                    "max_hw_sectors_kb)",
                )
            )
    return out
