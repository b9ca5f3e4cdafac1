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
  limit (iotune.model.swapfiles.parameter_placement cites the lines). N_p counts the
  elements that get a parameter file, N_r those of them that stay on the drive (read back
  at every use), N_k those of N_r that are persistent (stage3_param_persistence_threshold).
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

What each rank swaps, file by file, and where each parameter's partition lives are
iotune.model.swapfiles; host RAM, term by term, iotune.model.hostram.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iotune.model.dsconfig import min_aio_bytes, model_element_size
from iotune.model.hostram import HostRam, host_ram
from iotune.model.presets import Preset
from iotune.model.swapfiles import Swapped, swapped_counts, zero_setting
from iotune.units import GIB

#: CUDA context, cuBLAS workspace and allocator slack on the GPU
CUDA_RESERVE = 2 * GIB


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
    #: ZeRO-3's gradient bucket (``reduce_bucket_size``, elements of the whole model): backward
    #: hands DeepSpeed its gradients a bucket at a time, and each bucket's are written then
    reduce_bucket: int = 500_000_000

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
        reduce_bucket=max(1, int(zo.get("reduce_bucket_size", 500_000_000))),
    )


def resumed_init_first(e: Estimate, copy: str, save_on_offload: bool) -> IoVolume | None:
    """A run resumed from a save of its NVMe-offloaded optimizer: its initialisation and
    first step on the offload drives. A fresh start's initialisation (above), then DeepSpeed's
    ``load_checkpoint`` (runtime/engine.py): the save's swap files copied back into the swap
    folder, 12 bytes a swapped parameter written (*copy* ``reflink`` clones them: none), then
    ``reset_swap_buffers`` (zero/stage3.py) reads each sub-group's fp32 master and writes it
    back, 4 and 4. With Adam's state put back after the load
    (iotune.workers.checkpoints.restore_swapped_adam), the first step swaps the moments in as
    every later step does: a steady step's I/O, where a fresh start's first step reads the
    master alone. The copy's reads come from the save's volume, which is not the offload
    drives'; where it is (*save_on_offload*, other than a clone), they are not modelled (a
    page-cache copy may find them cached), nor are parameters on NVMe or ZenFlow's updates
    every few steps: None."""
    sw = e.swapped
    if not sw.n_s or sw.n_p or e.update_interval != 1 or e.first_update is not None:
        return None
    if save_on_offload and copy != "reflink":
        return None
    copied = 0 if copy == "reflink" else 12 * sw.n_s
    return e.init + IoVolume(4 * sw.n_s, 4 * sw.n_s + copied) * e.ranks + e.steady_step


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


def per_n(x: int, n: int) -> str:
    """A byte count as a multiple of N, the way the formulas read: 24.0N."""
    return f"{x / n:.1f}N" if n else "0"
