"""What one rank swaps to NVMe under ZeRO-3 offload, in DeepSpeed's own order: its partition of
each parameter (rank_tensors), the optimizer's sub-groups, the fp32 master, moment and
gradient swap files of each with their lengths rounded to the aio alignment (swap_layout),
where each parameter's partition lives during training with offload_param on NVMe
(parameter_placement), and the counts iotune.model.estimate is built from (swapped_counts:
N, N_s, N_g, N_p, N_r, N_k, which its docstring defines). Pure."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from iotune.model.dsconfig import min_aio_bytes, model_element_size
from iotune.model.presets import Preset


@dataclass(frozen=True)
class Swapped:
    n: int  # all parameters
    n_s: int  # elements in swapped optimizer sub-groups
    n_g: int  # gradient elements swapped
    n_p: int  # bf16 parameter elements with a file (0 without parameter offload)
    largest_subgroup: int
    largest_param: int
    n_r: int = 0  # of n_p, the elements left on the drive and read back at each use
    n_k: int = 0  # of n_r, the persistent ones: gathered once a step, kept between uses


def rank_tensors(preset: Preset) -> list[int]:
    """Each parameter's partition on one rank, in elements: ZeRO-3 splits every parameter
    over the data-parallel ranks, padding it to a multiple of their number
    (zero/partition_parameters.py: partition_size = ceil(numel / world_size))."""
    w = max(1, preset.world)
    return [-(-n // w) for _, n in preset.geometry.tensors()]


def swapped_counts(preset: Preset, cfg: dict[str, Any]) -> Swapped:
    """What one rank swaps (its partitions: all of it with one rank)."""
    tensors = rank_tensors(preset)
    zo = cfg.get("zero_optimization", {})
    min_bytes = min_aio_bytes(cfg)
    par_nvme = zo.get("offload_param", {}).get("device") == "nvme"
    groups = subgroups(preset, cfg)
    layout = swap_layout(preset, cfg)  # empty unless the optimizer state is on NVMe
    n_s = sum(s for s, _ in layout)
    n_g = sum(sum(gs) for _, gs in layout)
    eb = model_element_size(cfg)
    n_p = sum(n for n in tensors if eb * n >= min_bytes) if par_nvme else 0
    place = parameter_placement(preset, cfg)
    return Swapped(
        n=sum(tensors),
        n_s=n_s,
        n_g=n_g,
        n_p=n_p,
        largest_subgroup=max(groups) if groups else 0,
        largest_param=max(n for _, n in preset.geometry.tensors()),  # gathered whole
        n_r=sum(n for n, w in zip(tensors, place, strict=True) if w in (ON_NVME, PERSISTENT)),
        n_k=sum(n for n, w in zip(tensors, place, strict=True) if w == PERSISTENT),
    )


def zero_setting(zo: dict[str, Any], name: str, default: int) -> int:
    """A ZeRO-3 setting by its config key (stage3_NAME) or its pydantic field name (NAME),
    which DeepSpeed takes too (runtime/zero/config.py: populate_by_name)."""
    return int(zo.get(f"stage3_{name}", zo.get(name, default)))


#: where a parameter's partition lives during training (parameter_placement)
NO_FILE = "no file"  # under the aio minimum: a CPU (or, persistent, accelerator) tensor
IN_CPU = "in cpu"  # a file, read once at initialisation into the pinned CPU buffer
ON_NVME = "on nvme"  # a file read back at every use and written after every step
PERSISTENT = "persistent"  # on nvme, but gathered once a step and kept between uses


def parameter_placement(preset: Preset, cfg: dict[str, Any]) -> list[str]:
    """Where each parameter's partition (rank_tensors order) lives during training with
    offload_param on NVMe (all NO_FILE without it). DeepSpeed 0.19.8 decides it in two
    places, and nothing else (GPU memory, buffer_count x buffer_size, the swapper's free
    buffers, stage3_max_live_parameters) moves a partition between RAM and the drive:

    * zero.Init: a partition of at least max(1 MiB, aio.block_size) bytes gets a file and
      is swapped out; a smaller one is a CPU tensor for good
      (partition_parameters.py:1820-1836, partitioned_param_swapper.py:100,141).
    * deepspeed.initialize: one pinned CPU buffer per optimizer param group of
      min(its elements, max_in_cpu less the groups before) elements, a 1-element tensor
      where that is 0 (zero/stage3.py:888-911; offload_param.max_in_cpu, default 1e9
      elements: offload_config.py:39). The optimizer's sub-groups fill it in order, each
      whole or not at all (stage3.py:984-993): the swappable parameters of a sub-group that
      fits are read into it once and marked 'not-nvme' (stage3.py:873-886), so they are
      never read or written on the drive again; those of a sub-group that does not stay on
      the drive. iotune's worker and a plain script pass model.parameters() as one group,
      as the Trainer does with an "optimizer" section in its config (its DummyOptim); a
      Trainer config without one gets the Trainer's own two groups (decay, no decay), not
      modelled here.

    A parameter at or below stage3_param_persistence_threshold elements (its whole numel,
    within stage3_model_persistence_threshold in parameters() order:
    parameter_offload.py:317-329) is never released after use
    (partitioned_param_coordinator.py:640), has its swap buffer freed once gathered
    (:615-620), is released by the optimizer step (stage3.py:2878) and gathered again
    right after it (stage3.py:2841): one read a step where it stays on the drive."""
    tensors = rank_tensors(preset)
    zo = cfg.get("zero_optimization", {})
    op = zo.get("offload_param") or {}
    if not isinstance(op, dict) or op.get("device") != "nvme":
        return [NO_FILE] * len(tensors)
    eb = model_element_size(cfg)
    min_bytes = min_aio_bytes(cfg)
    keep = zero_setting(zo, "param_persistence_threshold", 100_000)
    model_keep = zero_setting(zo, "model_persistence_threshold", sys.maxsize)
    persistent: list[bool] = []
    kept = 0
    for _, full in preset.geometry.tensors():  # ds_numel: the whole parameter
        if full + kept > model_keep:
            persistent.append(False)
            continue
        persistent.append(full <= keep)
        kept += full if full <= keep else 0
    budget = min(sum(tensors), int(op.get("max_in_cpu", 1_000_000_000)))
    capacity = budget if budget > 0 else 1  # torch.empty(1) where nothing is kept
    out = [NO_FILE] * len(tensors)
    offset = 0
    for group in _subgroup_indices(preset, cfg):
        size = sum(tensors[i] for i in group)
        fits = offset + size <= capacity
        offset += size
        for i in group:
            if eb * tensors[i] < min_bytes:
                continue
            out[i] = IN_CPU if fits else PERSISTENT if persistent[i] else ON_NVME
    return out


def _subgroup_indices(preset: Preset, cfg: dict[str, Any]) -> list[list[int]]:
    """Each optimizer sub-group's parameters, as indices into rank_tensors: a sub-group
    closes once it reaches sub_group_size and never splits a parameter (zero/stage3.py
    _create_fp16_sub_groups)."""
    size = int(cfg.get("zero_optimization", {}).get("sub_group_size", 1_000_000_000))
    groups: list[list[int]] = []
    cur: list[int] = []
    elements = 0
    for i, n in enumerate(rank_tensors(preset)):
        cur.append(i)
        elements += n
        if elements >= size:
            groups.append(cur)
            cur, elements = [], 0
    if cur:
        groups.append(cur)
    return groups


def _subgroup_tensors(preset: Preset, cfg: dict[str, Any]) -> list[list[int]]:
    """Each optimizer sub-group's parameter tensors, in elements."""
    tensors = rank_tensors(preset)
    return [[tensors[i] for i in g] for g in _subgroup_indices(preset, cfg)]


def subgroups(preset: Preset, cfg: dict[str, Any]) -> list[int]:
    """Optimizer sub-group sizes in elements."""
    return [sum(g) for g in _subgroup_tensors(preset, cfg)]


def swap_layout(preset: Preset, cfg: dict[str, Any]) -> list[tuple[int, list[int]]]:
    """What DeepSpeed swaps per optimizer sub-group, in its order: (elements of the fp32
    master and of each Adam moment, 0 when the sub-group stays in RAM; elements of each
    gradient it swaps, one file per parameter). The sums are ``n_s`` and ``n_g`` of
    :func:`swapped_counts`."""
    zo = cfg.get("zero_optimization", {})
    if zo.get("offload_optimizer", {}).get("device") != "nvme":
        return []
    min_bytes = min_aio_bytes(cfg)
    a = swap_alignment(cfg)
    out = []
    for g in _subgroup_tensors(preset, cfg):
        # the fp32 master and each moment: one file of the sub-group's elements rounded up
        # to the alignment (OptimizerSwapper._io_aligned_numel: the buffer and the file)
        state = -(-sum(g) // a) * a if 4 * sum(g) >= min_bytes else 0
        # each parameter's gradient: its aligned part is swapped, the remainder (fewer than
        # the alignment's elements, under the aio minimum) kept in memory
        # (_adjust_for_misaligned_lengths)
        grads = [n // a * a for n in g if 4 * (n // a * a) >= min_bytes]
        out.append((state, grads))
    return out


def swap_alignment(cfg: dict[str, Any]) -> int:
    """The fp32 elements an optimizer swap file's length is a multiple of: 1024 bytes
    (swap_tensor/utils.py AIO_ALIGNED_BYTES) times aio.intra_op_parallelism, over 4 bytes
    (swap_tensor/optimizer_utils.py OptimizerSwapper.numel_alignment)."""
    par = max(1, int(cfg.get("aio", {}).get("intra_op_parallelism", 1)))
    return 1024 * par // 4


def swap_files(
    preset: Preset, cfg: dict[str, Any], *, parameters: bool = True
) -> tuple[list[int], list[int]]:
    """The files one rank reads and writes in a steady step, in bytes, each listed as often
    as the step moves it (weights for :func:`iotune.plan.drives.stripe_share`, not a byte
    count: :mod:`iotune.model.estimate` counts the bytes). DeepSpeed's async I/O moves one
    file per operation: each sub-group's fp32 master and two moments, read and written; each
    gradient's file, written in backward and read in the optimizer step; with *parameters*,
    each partition left on the drive, read in forward and backward (once where it is
    persistent) and written after the optimizer step."""
    reads: list[int] = []
    writes: list[int] = []
    for state, grads in swap_layout(preset, cfg):
        moved = [4 * state] * 3 if state else []
        moved += [4 * n for n in grads]
        reads += moved
        writes += moved
    if parameters:
        eb = model_element_size(cfg)
        place = parameter_placement(preset, cfg)
        for n, where in zip(rank_tensors(preset), place, strict=True):
            if where in (ON_NVME, PERSISTENT):
                reads += [eb * n] * (1 if where == PERSISTENT else 2)
                writes.append(eb * n)
    return reads, writes
