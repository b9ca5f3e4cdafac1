"""What a preset will need (GPU memory, host RAM, NVMe space) and how many bytes DeepSpeed will
read and write on the NVMe path, from the parameter tensors and the DeepSpeed config. Pure.

The I/O model follows DeepSpeed's ZeRO-3 swap code (0.16 to 0.19; file references are to
deepspeed/runtime/). N_s counts the elements of optimizer sub-groups that are swapped,
N_g the gradient elements swapped, N_p the bf16 parameter elements swapped; for a model of
billions of parameters all three equal the parameter count N.

* Only tensors of at least max(1 MiB, aio.block_size) bytes are swapped
  (swap_tensor/utils.py MIN_AIO_BYTES, optimizer_utils.py min_aio_bytes): a sub-group's fp32
  partition (zero/stage3.py _create_fp32_partitions), a parameter's fp32 gradient
  (optimizer_utils.py swap_out_gradients, smaller ones stay in RAM), a bf16 parameter
  partition (partitioned_param_swapper.py swappable_tensor).
* Optimizer state on NVMe. Footprint: fp32 master, exp_avg and exp_avg_sq per sub-group and
  the fp32 gradients: 12 N_s + 4 N_g (16 N).
  - deepspeed.initialize: _create_fp32_partitions writes the fp32 master (4 N_s);
    initialize_optimizer_states swaps it in and out again (read 4 N_s, write 4 N_s). Adam's
    moments do not exist yet (created lazily by the first step).
  - first step: gradients are written at the accumulation boundary (4 N_g); the step reads
    fp32 master and gradients (4 N_s + 4 N_g) and writes master and both moments (12 N_s).
  - every later step: reads master, moments and gradients (12 N_s + 4 N_g), writes the
    gradients and the three states (12 N_s + 4 N_g). Gradient accumulation happens in a CPU
    buffer: micro-steps between boundaries do no NVMe I/O.
  - so initialisation + first step: read 12 N, write 24 N; steady step: read 16 N, write 16 N.
* Parameters on NVMe as well (offload_param). Footprint + 2 N_p (one bf16 file per parameter).
  - construction: zero.Init partitions and writes each parameter (2 N_p); iotune then
    initialises the weights module by module with the parameters gathered, reading and
    writing them again (2 N_p each).
  - deepspeed.initialize: _create_fp32_partitions reads the bf16 partitions (2 N_p);
    initialize_optimizer_states writes them back (2 N_p).
  - every micro-step fetches the parameters for forward, for the recomputation of each
    checkpointed layer, and for backward. While DeepSpeed records the first step's trace it
    releases each parameter after use (three reads, 6 N_p); afterwards parameters reused
    within stage3_max_reuse_distance elements stay resident, so recompute and backward share
    a fetch (2 N_p + 2 max(0, N_p - max_reuse_distance) per micro-step).
  - after the optimizer step the updated bf16 parameters are written back (2 N_p).
  - with tied embeddings, zero.Init has already swapped out lm_head's own weight when
    transformers ties it to the embedding: one unused 2 x vocab x hidden file stays.
  Measured on the tiny CPU preset, parameter offload's initialisation reads more than this
  (the tied embedding is fetched once per module that uses it); footprint and steady
  steps agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iotune.train.presets import Preset, min_aio_bytes
from iotune.units import GIB

#: torch + DeepSpeed + transformers in one process, before the model
PROCESS_BASE = 3 * GIB
#: CUDA context, cuBLAS workspace and allocator slack
CUDA_RESERVE = 2 * GIB


@dataclass(frozen=True)
class Swapped:
    n: int  # all parameters
    n_s: int  # elements in swapped optimizer sub-groups
    n_g: int  # gradient elements swapped
    n_p: int  # bf16 parameter elements swapped (0 without parameter offload)
    largest_subgroup: int
    largest_param: int


@dataclass(frozen=True)
class IoVolume:
    read: int
    write: int

    def __add__(self, o: IoVolume) -> IoVolume:
        return IoVolume(self.read + o.read, self.write + o.write)


@dataclass(frozen=True)
class Estimate:
    preset: str
    params: int
    swapped: Swapped
    nvme_bytes: int
    init: IoVolume
    first_step: IoVolume
    steady_step: IoVolume
    gpu_bytes: int | None  # None on a CPU run
    host_bytes: int
    activation_bytes: int

    @property
    def init_first(self) -> IoVolume:
        return self.init + self.first_step


def swapped_counts(preset: Preset, cfg: dict[str, Any]) -> Swapped:
    tensors = [n for _, n in preset.geometry.tensors()]
    zo = cfg.get("zero_optimization", {})
    min_bytes = min_aio_bytes(cfg)
    opt_nvme = zo.get("offload_optimizer", {}).get("device") == "nvme"
    par_nvme = zo.get("offload_param", {}).get("device") == "nvme"
    # sub-groups: parameters in order, a group closes once it reaches sub_group_size
    # (zero/stage3.py _create_fp16_sub_groups)
    sub_group_size = int(zo.get("sub_group_size", 1_000_000_000))
    groups, cur = [], 0
    for n in tensors:
        cur += n
        if cur >= sub_group_size:
            groups.append(cur)
            cur = 0
    if cur:
        groups.append(cur)
    n_s = sum(g for g in groups if 4 * g >= min_bytes) if opt_nvme else 0
    n_g = sum(n for n in tensors if 4 * n >= min_bytes) if opt_nvme else 0
    n_p = sum(n for n in tensors if 2 * n >= min_bytes) if par_nvme else 0
    return Swapped(
        n=sum(tensors),
        n_s=n_s,
        n_g=n_g,
        n_p=n_p,
        largest_subgroup=max(groups) if groups else 0,
        largest_param=max(tensors),
    )


def activation_bytes(preset: Preset) -> int:
    """GPU (or CPU) memory for activations with gradient checkpointing, bf16: each layer's
    input kept for recomputation, one layer's working set during its recomputation, and the
    logits with their fp32 copy and gradient (the largest single item at vocab 128256)."""
    g = preset.geometry
    tokens = preset.micro_batch * preset.seq_len
    checkpoints = g.num_hidden_layers * tokens * g.hidden_size * 2
    if not preset.gradient_checkpointing:
        checkpoints *= 16
    layer = tokens * (16 * g.hidden_size + 4 * g.intermediate_size) * 2
    logits = tokens * g.vocab_size * (2 + 4 + 4 + 2)
    return checkpoints + layer + logits


def estimate(preset: Preset, cfg: dict[str, Any]) -> Estimate:
    sw = swapped_counts(preset, cfg)
    zo = cfg.get("zero_optimization", {})
    n, n_s, n_g, n_p = sw.n, sw.n_s, sw.n_g, sw.n_p
    ga = int(cfg.get("gradient_accumulation_steps", 1))
    init = first = steady = IoVolume(0, 0)
    nvme = 0
    if n_s or n_g:
        nvme += 12 * n_s + 4 * n_g
        init += IoVolume(4 * n_s, 8 * n_s)
        first += IoVolume(4 * n_s + 4 * n_g, 12 * n_s + 4 * n_g)
        steady += IoVolume(12 * n_s + 4 * n_g, 12 * n_s + 4 * n_g)
    if n_p:
        reuse = int(zo.get("stage3_max_reuse_distance", 1_000_000_000))
        per_micro = 2 * n_p + 2 * max(0, n_p - reuse)
        recording = (6 if preset.gradient_checkpointing else 4) * n_p
        nvme += 2 * n_p
        init += IoVolume(2 * n_p + 2 * n_p, 2 * n_p + 2 * n_p + 2 * n_p)
        g = preset.geometry
        orphan = 2 * g.vocab_size * g.hidden_size
        if g.tie_word_embeddings and orphan >= min_aio_bytes(cfg):
            # zero.Init partitions and swaps out lm_head's own weight before transformers
            # ties it to the embedding: its file stays on the drive, unused
            nvme += orphan
            init += IoVolume(0, orphan)
        first += IoVolume(recording + (ga - 1) * per_micro, 2 * n_p)
        steady += IoVolume(ga * per_micro, 2 * n_p)

    acts = activation_bytes(preset)
    s = preset.strategy
    off_opt = zo.get("offload_optimizer", {})
    off_par = zo.get("offload_param", {})
    # host RAM. Calibrated against the peak RSS of the 1B and 3B runs on an H100
    # (benchmarks/results/gpu-train-h100.md): besides the state below, about 5N of staging
    # copies (building and partitioning the model, fp32 conversions) stay resident.
    host = PROCESS_BASE + (5 * n if preset.accelerator == "cuda" else 0)
    if s.zenflow and zo.get("zenflow", {}).get("overlap_step"):
        # overlap_step runs the CPU update in a second process with its own copies
        host += 20 * n
    if off_opt.get("device") == "cpu":
        host += 16 * n  # fp32 master, two moments, fp32 gradients
    elif off_opt.get("device") == "nvme":
        # the fp32 gradient partition stays in RAM until the boundary, with a copy while
        # it is swapped; swap buffers hold buffer_count x the largest sub-group
        # (optimizer_utils.py)
        host += 6 * n + int(off_opt.get("buffer_count", 4)) * sw.largest_subgroup * 4
    if off_par.get("device") == "nvme":
        host += int(off_par.get("buffer_count", 5)) * int(off_par.get("buffer_size", 1e8)) * 2
        host += 2 * min(n, int(off_par.get("max_in_cpu", 1e9)))
    elif off_par.get("device") == "cpu":
        host += 2 * n
    gpu: int | None = None
    if preset.accelerator == "cuda":
        if s.optimizer == "gpu":
            # bf16 parameters and gradients, fp32 master, fp32 gradient accumulator, two
            # fp32 moments, and torch Adam's temporaries: 21N measured (3B on an H100)
            gpu = 21 * n
        else:
            gpu = (
                4 * n
                if s.params == "gpu"
                else 4 * 2 * max(sw.largest_param, n // max(1, preset.geometry.num_hidden_layers))
            )
            if s.zenflow:
                ratio = float(zo.get("zenflow", {}).get("topk_ratio", 0.1))
                gpu += int(ratio * 16 * n)  # the selected columns' state and gradients
        gpu += acts + CUDA_RESERVE
    else:
        host += 2 * n + acts  # the model and its activations live in RAM too
    return Estimate(
        preset=preset.name,
        params=n,
        swapped=sw,
        nvme_bytes=nvme,
        init=init,
        first_step=first,
        steady_step=steady,
        gpu_bytes=gpu,
        host_bytes=host,
        activation_bytes=acts,
    )


def per_n(x: int, n: int) -> str:
    """A byte count as a multiple of N, the way the formulas read: 24.0N."""
    return f"{x / n:.1f}N" if n else "0"
