"""Host RAM of one training process, term by term (HostRam), by what DeepSpeed allocates:
ZeRO stage 3, per rank; iotune.model.estimate's estimate holds it. Pure.

S_max is the largest optimizer sub-group (sub-groups close once they reach sub_group_size and
never split a parameter, so S_max is at least the largest parameter, zero/stage3.py
_create_fp16_sub_groups):
* gradient partitions: one buffer of every parameter's gradient in the accumulation dtype
  (bf16: 2N) on the host for any optimizer offload (zero/stage3.py _setup_for_real_optimizer,
  grad_partitions_flat_buffer), pinned with pin_memory. torch pins through its caching host
  allocator, which rounds a block up to a power of two; and pinning copies, so the pageable
  original and the pinned copy coexist once during initialisation.
* optimizer swap buffers (NVMe): buffer_count x S_max fp32 elements, page-locked whatever
  pin_memory says (swap_tensor/optimizer_utils.py OptimizerSwapper, utils.py
  SwapBufferManager). Adam needs 4 (parameter, two moments, gradient).
* optimizer state in RAM (device cpu): fp32 master 4N, fp32 gradients 4N (pinned per
  sub-group), Adam's moments 8N (ops/adam/cpu_adam.py, created by the first step).
* parameter swap buffers (offload_param nvme): buffer_count x buffer_size bf16 elements,
  locked, each at least the largest parameter (swap_tensor/partitioned_param_swapper.py);
  a pinned CPU cache of min(N, max_in_cpu) bf16 elements (zero/stage3.py
  _create_param_groups_fp16_flat_cpu_memory); a 2 S_max write-back buffer where a
  sub-group stays on the drive (zero/stage3.py: should_create_fp16_flat_reuse_buffer).
* transients: the first optimizer step creates Adam's moments as pageable tensors per
  sub-group (8 S_max) before the swapper copies them into its buffers, and every step
  stages a sub-group's fp32 master as bf16 on the way to the GPU (2 S_max); with the
  optimizer state in RAM, initialisation converts and clones each sub-group (8 S_max).
* the process itself (interpreter, torch, DeepSpeed, transformers, CUDA context): measured,
  the one constant here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iotune.model.dsconfig import model_element_size
from iotune.model.presets import Preset
from iotune.model.swapfiles import Swapped, rank_tensors, subgroups
from iotune.units import GIB

#: torch + DeepSpeed + transformers in one process, before the model: the worker's RSS at its
#: "ready" event with a CPU-only torch (0.35 GiB on the CI host)
PROCESS_BASE = 35 * GIB // 100
#: with a CUDA torch: its libraries (0.8 GiB at "ready" on the H100) and the CUDA context,
#: cuBLAS and allocator state that opt_nvme_1b's peak implies (benchmarks/results/
#: gpu-study-h100.md)
CUDA_HOST = 165 * GIB // 100
#: DeepSpeed's shared-memory allreduce workspace of one CPU rank (ops/csrc/cpu/comm/shm.cpp:
#: 2 NAIVE_ALLREDUCE_THRESHOLD + 2 MAX_BUF_SIZE)
SHM_WORKSPACE = 2 * 2**20 + 2 * 32 * 2**20


def pinned(n: int) -> int:
    """Bytes torch's caching host allocator takes to pin n bytes: the next power of two."""
    return 1 << max(0, (n - 1).bit_length()) if n > 0 else 0


@dataclass(frozen=True)
class HostRam:
    """Host RAM of one training process, term by term (see the module docstring)."""

    process: int
    gradients: int  # the bf16 gradient partitions (pinned, rounded)
    optimizer_state: int  # device cpu: fp32 master, fp32 gradients, Adam moments
    swap_buffers: int  # device nvme: the optimizer swapper's locked buffers
    param_buffers: int  # offload_param nvme: swap buffers, CPU cache, write-back buffer
    model: int  # a CPU run's bf16 model and activations
    init_transient: int  # pinning copy of the gradient partitions
    step_transient: int  # the first step's pageable moments and the bf16 staging
    collectives: int = 0  # several ranks: gathered parameters, shared-memory allreduce
    dtype: str = "bf16"  # the model's: gradients, parameter buffers and staging are in it

    @property
    def steady(self) -> int:
        return (
            self.process
            + self.gradients
            + self.optimizer_state
            + self.swap_buffers
            + self.param_buffers
            + self.model
            + self.collectives
        )

    @property
    def peak(self) -> int:
        return self.steady + max(self.init_transient, self.step_transient)

    def terms(self) -> list[tuple[str, int]]:
        return [
            ("process (interpreter, torch, DeepSpeed; with CUDA its context)", self.process),
            (f"gradient partitions ({self.dtype}, pinned)", self.gradients),
            ("optimizer state in RAM (fp32 master, gradients, Adam moments)", self.optimizer_state),
            ("optimizer swap buffers (locked)", self.swap_buffers),
            ("parameter swap buffers and CPU cache (locked)", self.param_buffers),
            ("model and activations (CPU run)", self.model),
            ("several ranks: gathered parameters, allreduce workspaces", self.collectives),
            ("peak at initialisation: pinning copy of the gradients", self.init_transient),
            (
                f"peak at the first step: new Adam moments, {self.dtype} staging",
                self.step_transient,
            ),
        ]


def host_ram(preset: Preset, cfg: dict[str, Any], sw: Swapped, acts: int) -> HostRam:
    """Host RAM by DeepSpeed's allocations (module docstring); one rank, ZeRO stage 3."""
    zo = cfg.get("zero_optimization", {})
    n = sw.n
    off_opt = zo.get("offload_optimizer", {}) or {}
    off_par = zo.get("offload_param", {}) or {}
    cuda = preset.accelerator == "cuda"
    # the cpu accelerator's pin_memory returns the tensor as it is: no rounding, no copy
    pin = pinned if cuda else (lambda b: b)
    s_max = sw.largest_subgroup
    eb = model_element_size(cfg)
    grads = optimizer = swap = params = 0
    init_t = step_t = 0
    if off_opt.get("device") in ("cpu", "nvme"):
        g = eb * n
        pin_grads = bool(off_opt.get("pin_memory", False))
        grads = pin(g) if pin_grads else g
        init_t = g if pin_grads and cuda else 0
        step_t = eb * s_max
        if off_opt["device"] == "nvme":
            swap = int(off_opt.get("buffer_count", 4)) * 4 * s_max
            step_t += 8 * s_max
        else:
            groups = subgroups(preset, cfg)
            fp32_grads = sum(pin(4 * x) if pin_grads else 4 * x for x in groups)
            optimizer = 4 * n + fp32_grads + 8 * n
            # _create_fp32_partitions converts a sub-group and clones it (zero/stage3.py)
            init_t = max(init_t, 8 * s_max)
    if off_par.get("device") == "nvme":
        count = int(off_par.get("buffer_count", 5))
        size = int(off_par.get("buffer_size", 100_000_000))
        cache = eb * min(n, int(off_par.get("max_in_cpu", 1_000_000_000)))
        # the write-back buffer exists only where a sub-group stays on the drive
        # (stage3.py:1007-1018)
        back = eb * s_max if _param_subgroup_on_nvme(preset, cfg) else 0
        params = eb * count * size + (pin(cache) if cache > eb else 0) + back
    elif off_par.get("device") == "cpu":
        params = pin(eb * n)
    # a CPU run keeps what a GPU would hold in RAM too: the bf16 parameters (unless they are
    # on NVMe), the gradient bucket they reduce through, and the activations
    model = 0 if cuda else (eb * n if off_par.get("device") != "nvme" else 0) + eb * n + acts
    collectives = 0
    world = max(1, preset.world)
    if world > 1 and not cuda:
        # a CPU rank gathers whole parameters from the others' partitions (bf16, beside its
        # own), and DeepSpeed's shared-memory allreduce maps every local rank's workspace
        # of 2 x 1 MiB + 2 x 32 MiB (ops/csrc/cpu/comm/shm.cpp) into each rank
        collectives = eb * (preset.geometry.param_count() - n) + preset.ranks * SHM_WORKSPACE
    return HostRam(
        process=PROCESS_BASE + (CUDA_HOST if cuda else 0),
        gradients=grads,
        optimizer_state=optimizer,
        swap_buffers=swap,
        param_buffers=params,
        model=model,
        init_transient=init_t,
        step_transient=step_t,
        collectives=collectives,
        dtype="bf16" if eb == 2 else "fp32",
    )


def _param_subgroup_on_nvme(preset: Preset, cfg: dict[str, Any]) -> bool:
    """Whether some optimizer sub-group has no room in max_in_cpu's CPU buffer (with
    offload_param on NVMe), swappable parameters or not (zero/stage3.py:984-993)."""
    op = cfg.get("zero_optimization", {}).get("offload_param") or {}
    if not isinstance(op, dict) or op.get("device") != "nvme":
        return False
    total = sum(rank_tensors(preset))
    budget = min(total, int(op.get("max_in_cpu", 1_000_000_000)))
    return total > max(1, budget)
