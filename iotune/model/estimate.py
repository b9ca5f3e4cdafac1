"""What a preset will need (GPU memory, host RAM, NVMe space) and how many bytes DeepSpeed will
read and write on the NVMe path, from the parameter tensors and the DeepSpeed config. Pure.

The I/O model follows DeepSpeed's ZeRO-3 swap code (0.16 to 0.19; file references are to
deepspeed/runtime/). N_s counts the elements of optimizer sub-groups that are swapped,
N_g the gradient elements swapped, N_p the bf16 parameter elements swapped (given a file);
for a model of billions of parameters all three equal the parameter count N.

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
* Parameters on NVMe as well (offload_param). Which partitions DeepSpeed reads back from the
  drive during training is decided at deepspeed.initialize, by offload_param.max_in_cpu and
  the optimizer's sub-groups, never by GPU memory, the swap buffers or the live-parameter
  limit (parameter_placement below cites the lines). N_p counts the elements that get a
  parameter file, N_r those of them that stay on the drive (read back at every use), N_k
  those of N_r that are persistent (stage3_param_persistence_threshold).
  - construction: zero.Init partitions and writes each swappable parameter once (eb N_p),
    after the module's own initialisation has filled it (nothing gathers it back to
    initialise again). Every file stays for the run: the footprint is eb N_p.
  - deepspeed.initialize reads the N_p - N_r elements kept in CPU memory once, into the
    pinned buffer, for good; it reads each of N_r twice (_create_fp32_partitions, and the
    gather of every parameter when it hooks the gradients) and initialize_optimizer_states
    writes N_r back. So N_p + N_r read and written (measured on the CPU: to the byte).
  - every micro-step fetches the non-persistent N_r - N_k for forward, for the
    recomputation of each checkpointed layer, and for backward. While DeepSpeed records
    the first step's trace it releases each parameter after use (three reads); afterwards
    parameters reused within stage3_max_reuse_distance elements stay resident, so
    recompute and backward share a fetch ((N_r - N_k) + max(0, N_r - N_k - distance) per
    micro-step; measured on an H100 with the presets' distance 0: 2.1 fetches a step after
    the first's 3.0). A persistent parameter is released like any other while the trace
    is recorded, then stays gathered from its next use to the optimizer step and is
    gathered again right after it: one read a steady step, whatever the accumulation.
  - after the optimizer step the updated partitions of N_r are written back (eb N_r); the
    ones in CPU memory are updated there and never written again.
  - so with max_in_cpu at or above the model (DeepSpeed's default 1e9 elements), a steady
    step moves no parameter bytes at all: read 16N, write 16N, as the optimizer state alone
    (the Hugging Face Trainer's ZeRO-3 template at 0.29B on an H200, measured).
  - with tied embeddings, zero.Init has already swapped out lm_head's own weight when
    transformers ties it to the embedding: one unused 2 x vocab x hidden file stays.
  Measured on the tiny CPU preset, parameter offload's initialisation reads more than this
  (the tied embedding is fetched once per module that uses it); footprint and steady
  steps agree.
* ZenFlow (zenflow/engine.py sets gradient_accumulation_steps to update_interval and makes
  the accumulation boundary its update boundary): the offloaded optimizer step, with its
  NVMe swaps, runs only on every update_interval-th step; the steps between only update the
  selected columns on the GPU and accumulate the rest in RAM. So initialisation is as above,
  the first update step moves what a first step moves, every later update what a steady
  step moves, and the other steps none.

Host RAM (HostRam below), ZeRO stage 3, per rank; S_max is the largest optimizer sub-group
(sub-groups close once they reach sub_group_size and never split a parameter, so S_max is
at least the largest parameter, zero/stage3.py _create_fp16_sub_groups):
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

import sys
from dataclasses import dataclass
from typing import Any

from iotune.model.dsconfig import min_aio_bytes, model_element_size
from iotune.model.presets import Preset
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
#: CUDA context, cuBLAS workspace and allocator slack on the GPU
CUDA_RESERVE = 2 * GIB


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


@dataclass(frozen=True)
class IoVolume:
    read: int
    write: int

    def __add__(self, o: IoVolume) -> IoVolume:
        return IoVolume(self.read + o.read, self.write + o.write)

    def __mul__(self, k: int) -> IoVolume:
        return IoVolume(self.read * k, self.write * k)


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
    host_bytes: int  # the peak: what preflight checks and an OOM kill sees
    activation_bytes: int
    host: HostRam | None = None
    update_interval: int = 1  # ZenFlow: the optimizer (and NVMe) step runs every k-th step
    first_update: IoVolume | None = None  # ZenFlow: the first update step's I/O
    update: IoVolume | None = None  # ZenFlow: every later update step's I/O
    ranks: int = 1  # ranks on this node: the volumes, space and host RAM above are theirs
    world: int = 1  # data-parallel ranks in all: swapped and host are one rank's
    caveats: tuple[str, ...] = ()  # where DeepSpeed's I/O is known to leave the model

    def per_rank(self, v: IoVolume) -> IoVolume:
        return IoVolume(v.read // self.ranks, v.write // self.ranks)

    def interval_mean(self, first: bool) -> IoVolume | None:
        """ZenFlow: the mean I/O per step over one update interval (the first or a later)."""
        upd = self.first_update if first else self.update
        if upd is None:
            return None
        k = self.update_interval
        return IoVolume(upd.read // k, upd.write // k)

    @property
    def init_first(self) -> IoVolume:
        return self.init + self.first_step


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
    groups = _subgroups(preset, cfg)
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


def activation_bytes(preset: Preset, eb: int = 2) -> int:
    """GPU (or CPU) memory for activations with gradient checkpointing, in the model's dtype
    of *eb* bytes: each layer's input kept for recomputation, one layer's working set during
    its recomputation, and the logits with their fp32 copy and gradient (the largest single
    item at vocab 128256)."""
    g = preset.geometry
    tokens = preset.micro_batch * preset.seq_len
    checkpoints = g.num_hidden_layers * tokens * g.hidden_size * eb
    if not preset.gradient_checkpointing:
        checkpoints *= 16
    layer = tokens * (16 * g.hidden_size + 4 * g.intermediate_size) * eb
    logits = tokens * g.vocab_size * (eb + 4 + 4 + eb)
    return checkpoints + layer + logits


def estimate(preset: Preset, cfg: dict[str, Any]) -> Estimate:
    """The preset's needs and I/O on one node: every rank of the node swaps its own
    partitions (:func:`rank_tensors`) to the same volume, so the NVMe space and the bytes per
    step are one rank's times the node's ranks, host RAM is one rank's times the ranks (each
    has its own pinned buffers), and GPU memory is per device."""
    sw = swapped_counts(preset, cfg)
    zo = cfg.get("zero_optimization", {})
    n, n_s, n_g, n_p = sw.n, sw.n_s, sw.n_g, sw.n_p
    ga = int(cfg.get("gradient_accumulation_steps", 1))
    eb = model_element_size(cfg)  # a parameter file's element: 2 in bf16, 4 in float32
    init = first = steady = IoVolume(0, 0)
    nvme = 0
    if n_s or n_g:
        nvme += 12 * n_s + 4 * n_g
        init += IoVolume(4 * n_s, 8 * n_s)
        first += IoVolume(4 * n_s + 4 * n_g, 12 * n_s + 4 * n_g)
        steady += IoVolume(12 * n_s + 4 * n_g, 12 * n_s + 4 * n_g)
    if n_p:
        n_r, n_k = sw.n_r, sw.n_k
        fetched = n_r - n_k  # released after use, fetched again at the next
        reuse = zero_setting(zo, "max_reuse_distance", 1_000_000_000)
        per_micro = eb * fetched + eb * max(0, fetched - reuse)
        # while the first micro-step records the trace, every parameter is released after
        # each use, persistent or not (partitioned_param_coordinator.py:498-499)
        recording = (3 if preset.gradient_checkpointing else 2) * eb * n_r
        # every file is written by zero.Init and stays (partition_parameters.py:1893)
        nvme += eb * n_p
        # construction writes N_p; initialisation reads the CPU-kept ones once
        # (stage3.py:876) and the drive's twice (stage3.py:1138 or 1154, and the gather
        # at 1504), and writes the drive's back (stage3.py:1347)
        init += IoVolume(eb * (n_p - n_r) + 2 * eb * n_r, eb * n_p + eb * n_r)
        for _, tied in preset.geometry.tied_tensors():
            orphan = eb * -(-tied // max(1, preset.world))
            if orphan >= min_aio_bytes(cfg):
                # zero.Init partitions and swaps out lm_head's own weight before transformers
                # ties it to the embedding: its file stays on the drive, unused
                nvme += orphan
                init += IoVolume(0, orphan)
        # persistent ones: read again in the second micro-step's forward and kept, and read
        # after every optimizer step (stage3.py:2841); the updated partitions on the drive
        # are written back (stage3.py:2854-2864), the CPU-kept ones are updated in place
        again = eb * n_k if ga > 1 else 0
        first += IoVolume(recording + (ga - 1) * per_micro + again + eb * n_k, eb * n_r)
        steady += IoVolume(ga * per_micro + eb * n_k, eb * n_r)

    acts = activation_bytes(preset, eb)
    s = preset.strategy
    host = host_ram(preset, cfg, sw, acts)
    gpu: int | None = None
    if preset.accelerator == "cuda":
        if s.optimizer == "gpu":
            # bf16 parameters and gradients, fp32 master, fp32 gradient accumulator, two
            # fp32 moments, and torch Adam's temporaries: 21N measured (3B on an H100)
            gpu = 21 * n
        else:
            # bf16 partitions (zero/stage3.py lp_param_buffer) or, with parameter offload, the
            # parameters gathered at once; the gradient bucket (2 reduce_bucket_size) and its
            # transients at the boundary (fp32 copy for the swap, reduce-scatter: 8 more)
            bucket = int(zo.get("reduce_bucket_size", 500_000_000))
            gpu = (
                2 * n
                if s.params == "gpu"
                else 4 * 2 * max(sw.largest_param, n // max(1, preset.geometry.num_hidden_layers))
            ) + 10 * bucket
            if s.zenflow:
                # the selected columns' bf16 moments and gradients
                # (ops/adam/zenflow_torch_adam.py)
                ratio = float(zo.get("zenflow", {}).get("topk_ratio", 0.1))
                gpu += int(ratio * 6 * n)
        gpu += acts + CUDA_RESERVE
    interval = 1
    first_update = update = None
    if s.zenflow and "zenflow" in zo:
        interval, per_step = zenflow_schedule(int(zo["zenflow"].get("update_interval", 1)), ga)
        if interval > 1:
            # the offloaded step runs at update boundaries only: a step between moves nothing
            first_update, update = first, steady
            first = steady = IoVolume(0, 0)
        elif per_step > 1:
            # several updates within one step's micro-steps, each a whole offloaded step
            first = first + IoVolume(steady.read * (per_step - 1), steady.write * (per_step - 1))
            steady = IoVolume(steady.read * per_step, steady.write * per_step)
    k = max(1, preset.ranks)
    caveats = []
    if sw.n_r and preset.geometry.tied_tensors():
        caveats.append(
            "tied weights with the parameters on NVMe: a step reads a tied weight's file 0 to "
            "2 times, where one is counted here (DeepSpeed keeps it gathered between its two "
            "uses, or not; a tiny Qwen2 read it 0, 1 and 2 times in three steps), and "
            "initialisation reads its file twice more"
        )
    return Estimate(
        caveats=tuple(caveats),
        preset=preset.name,
        params=preset.geometry.param_count(),
        swapped=sw,
        nvme_bytes=nvme * k,
        init=init * k,
        first_step=first * k,
        steady_step=steady * k,
        gpu_bytes=gpu,
        host_bytes=host.peak * k,
        activation_bytes=acts,
        host=host,
        update_interval=interval,
        first_update=None if first_update is None else first_update * k,
        update=None if update is None else update * k,
        ranks=k,
        world=max(1, preset.world),
    )


def zenflow_schedule(update_interval: int, ga: int) -> tuple[int, int]:
    """ZenFlow's full (offloaded) update in optimizer steps: (every how many steps, how many
    per step). ZenFlow counts update_interval in micro-steps, engine.step() calls, one per
    backward (runtime/zenflow/engine.py: the engine's gradient accumulation is set to
    update_interval and the boundary is micro_steps % update_interval), and iotune's
    optimizer step is ga micro-steps: with ga 4 and update_interval 4 every step updates
    (measured: 16N read and written per step on an H100). An interval that does not divide
    or is not divided by ga is rounded to whole steps."""
    u = max(1, update_interval)
    if u >= ga:
        return max(1, round(u / ga)), 1
    return 1, max(1, round(ga / u))


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
            groups = _subgroups(preset, cfg)
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


def _param_subgroup_on_nvme(preset: Preset, cfg: dict[str, Any]) -> bool:
    """Whether some optimizer sub-group has no room in max_in_cpu's CPU buffer (with
    offload_param on NVMe), swappable parameters or not (zero/stage3.py:984-993)."""
    op = cfg.get("zero_optimization", {}).get("offload_param") or {}
    if not isinstance(op, dict) or op.get("device") != "nvme":
        return False
    total = sum(rank_tensors(preset))
    budget = min(total, int(op.get("max_in_cpu", 1_000_000_000)))
    return total > max(1, budget)


def _subgroups(preset: Preset, cfg: dict[str, Any]) -> list[int]:
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


def per_n(x: int, n: int) -> str:
    """A byte count as a multiple of N, the way the formulas read: 24.0N."""
    return f"{x / n:.1f}N" if n else "0"
