"""The I/O and memory model of ZeRO-3 offload (iotune.model.estimate, swapfiles, hostram)
counted by hand: small models of chosen tensors, each figure written out with its reason (the
modules' docstrings' counts, DeepSpeed's defaults and boundaries), an invariant, or a
boundary case.

The models are ModelGeometry objects whose parameter tensors are listed one by one (elements,
in parameters() order), so every sum is short; their shape fields (hidden 8, intermediate 24,
vocab 100) feed only the activations. bf16 unless said: 2 bytes a parameter element, and a
tensor gets a swap file from 1 MiB = 524288 elements (262144 in fp32)."""

from __future__ import annotations

from typing import Any

import pytest

from iotune.model.estimate import (
    CUDA_RESERVE,
    Estimate,
    IoVolume,
    activation_bytes,
    estimate,
    per_n,
    zenflow_schedule,
)
from iotune.model.geometry import Geometry, ModelGeometry
from iotune.model.hostram import (
    CUDA_HOST,
    PROCESS_BASE,
    SHM_WORKSPACE,
    HostRam,
    _param_subgroup_on_nvme,
    pinned,
)
from iotune.model.presets import Preset, Strategy
from iotune.model.swapfiles import (
    IN_CPU,
    NO_FILE,
    ON_NVME,
    PERSISTENT,
    _subgroup_indices,
    parameter_placement,
    swap_layout,
    swapped_counts,
)

MIB = 1 << 20
#: DeepSpeed's defaults (runtime/zero/config.py, offload_config.py): sub_group_size,
#: offload_param.max_in_cpu and stage3_max_reuse_distance are 1e9 elements
BILLION = 1_000_000_000


def _model(*sizes: int, tied: int = 0, layers: int = 1) -> ModelGeometry:
    return ModelGeometry(
        hidden_size=8,
        intermediate_size=24,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=bool(tied),
        vocab_size=100,
        source="hand",
        params=tuple((f"t{i}", n) for i, n in enumerate(sizes)),
        tied=(("lm_head.weight", tied),) if tied else (),
    )


def _preset(
    geometry: Geometry,
    *,
    optimizer: str = "nvme",
    params: str = "gpu",
    zenflow: bool = False,
    accelerator: str = "cuda",
    checkpointing: bool = True,
    ranks: int = 1,
    nodes: int = 1,
    micro_batch: int = 1,
    seq_len: int = 4,
) -> Preset:
    strategy = Strategy(
        name="hand",
        about="by hand",
        stage=3,
        optimizer=optimizer,
        params=params,
        zenflow=zenflow,
        gradient_checkpointing=checkpointing,
    )
    return Preset(
        name="hand",
        size="custom",
        geometry=geometry,
        strategy=strategy,
        ga=1,
        micro_batch=micro_batch,
        seq_len=seq_len,
        steps=3,
        accelerator=accelerator,
        nvme_path=None,
        deepspeed={},
        gradient_checkpointing=checkpointing,
        ranks=ranks,
        nodes=nodes,
    )


def _cfg(bf16: bool = True, ga: int | None = None, **zo: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"zero_optimization": {"stage": 3, **zo}}
    if bf16:
        cfg["bf16"] = {"enabled": True}
    if ga is not None:
        cfg["gradient_accumulation_steps"] = ga
    return cfg


NVME = {"device": "nvme"}
#: an optimizer swap file's length is a multiple of 256 fp32 elements (1024 bytes:
#: swap_tensor/utils.py AIO_ALIGNED_BYTES, optimizer_utils.py _io_aligned_numel): the master's
#: and the moments' files are rounded up to it; a gradient's aligned part is swapped and its
#: remainder kept in memory (_adjust_for_misaligned_lengths)
ALIGN = 256


def up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def down(n: int) -> int:
    return n // ALIGN * ALIGN


def _opt(n_s: int, n_g: int) -> tuple[IoVolume, IoVolume]:
    """The optimizer state's first and steady step (module docstring): the first reads the
    fp32 master and the gradients, writes master, both moments and the gradients; a steady
    step reads and writes all of it."""
    return (
        IoVolume(4 * n_s + 4 * n_g, 12 * n_s + 4 * n_g),
        IoVolume(12 * n_s + 4 * n_g, 12 * n_s + 4 * n_g),
    )


# ----------------------------------------------------------------------------- small pieces


@pytest.mark.parametrize(
    ("n", "want"),
    [
        (0, 0),  # nothing to pin
        (-3, 0),
        (1, 1),  # 2**0
        (2, 2),
        (3, 4),
        (4, 4),  # an exact power stays
        (5, 8),  # one above goes to the next
        (MIB, MIB),
        (MIB + 1, 2 * MIB),
        (10_002_000, 1 << 24),  # 2**23 = 8388608 < 10002000 <= 2**24 = 16777216
    ],
)
def test_pinned_is_the_next_power_of_two(n: int, want: int) -> None:
    assert pinned(n) == want


def test_io_volumes_multiply_and_split_in_whole_bytes() -> None:
    assert IoVolume(3, 5) * 3 == IoVolume(9, 15)
    assert IoVolume(3, 5) + IoVolume(1, 2) == IoVolume(4, 7)
    # two ranks on the node: one rank's share, floored to whole bytes
    e = estimate(_preset(_model(2_000_000), ranks=2), _cfg(offload_optimizer=NVME))
    assert e.ranks == 2 and e.world == 2
    share = e.per_rank(IoVolume(7, 9))
    assert share == IoVolume(3, 4) and isinstance(share.read, int) and isinstance(share.write, int)
    # each rank swaps its half (1e6 elements of the one tensor): the node's volume is twice
    # one rank's (steady step 16 bytes an element)
    # (1000000 is not a multiple of 256: the files hold up(1e6), the gradient down(1e6))
    one = 12 * up(1_000_000) + 4 * down(1_000_000)
    assert e.per_rank(e.steady_step) == IoVolume(one, one)
    assert e.steady_step == IoVolume(2 * one, 2 * one)


def test_per_n_reads_a_volume_as_a_multiple_of_n() -> None:
    assert per_n(24 * 1000, 1000) == "24.0N"
    assert per_n(5, 0) == "0"


def test_activation_bytes_counted_by_hand() -> None:
    """Llama-like h 8, i 24, 3 layers, vocab 100, micro-batch 2 x 5 tokens = 10 tokens:
    the layers' inputs kept for recomputation (3 x 10 x 8 x eb), one layer's working set
    (10 x (16 x 8 + 4 x 24) x eb = 10 x 224 x eb) and the logits with their fp32 copy and
    gradient (10 x 100 x (eb + 4 + 4 + eb))."""
    g = Geometry(
        hidden_size=8,
        intermediate_size=24,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
        vocab_size=100,
    )
    p = _preset(g, micro_batch=2, seq_len=5)
    assert activation_bytes(p, 2) == 480 + 4480 + 12000
    assert activation_bytes(p) == 16960  # bf16 is the default
    assert activation_bytes(p, 4) == 960 + 8960 + 16000
    # without checkpointing each layer keeps 16 times its input
    no_gc = _preset(g, micro_batch=2, seq_len=5, checkpointing=False)
    assert activation_bytes(no_gc, 2) == 16 * 480 + 4480 + 12000
    assert activation_bytes(no_gc, 4) == 16 * 960 + 8960 + 16000
    # estimate() takes the model's dtype: a config without bf16 is float32
    fp32 = estimate(p, _cfg(bf16=False))
    assert fp32.activation_bytes == 25920
    assert fp32.preset == "hand"


@pytest.mark.parametrize(
    ("update_interval", "ga", "want"),
    [
        (1, 1, (1, 1)),  # every micro-step is a step: update every step
        (0, 1, (1, 1)),  # taken as 1
        (4, 4, (1, 1)),  # 4 micro-steps = one step (measured: 16N a step on an H100)
        (8, 4, (2, 1)),  # 8 micro-steps = every second step
        (16, 1, (16, 1)),
        (5, 4, (1, 1)),  # 1.25 steps, rounded
        (6, 4, (2, 1)),  # 1.5 rounds to 2 (round half to even)
        (1, 4, (1, 4)),  # an update after each of the 4 micro-steps
        (2, 4, (1, 2)),
        (3, 4, (1, 1)),  # 4/3 rounds to 1
        (2, 3, (1, 2)),  # 1.5 rounds to 2
    ],
)
def test_zenflow_schedule_in_whole_steps(
    update_interval: int, ga: int, want: tuple[int, int]
) -> None:
    assert zenflow_schedule(update_interval, ga) == want


# ------------------------------------------------------------------ sub-groups and placement


def test_a_subgroup_closes_when_it_reaches_sub_group_size() -> None:
    """_create_fp16_sub_groups: a sub-group closes once its elements reach the size (9 + 1 =
    10 closes at 10), never splitting a parameter."""
    p = _preset(_model(9, 1, 9, 1, 3))
    assert _subgroup_indices(p, _cfg(sub_group_size=10)) == [[0, 1], [2, 3], [4]]
    # DeepSpeed's default, 1e9 elements: a parameter of exactly 1e9 closes its own group
    big = _preset(_model(BILLION, 1, 5))
    assert _subgroup_indices(big, {}) == [[0], [1, 2]]


def test_swap_layout_at_the_aio_minimum() -> None:
    """Only tensors of at least 1 MiB are swapped: in fp32, 262144 elements. Sub-groups of
    262144: the first (exactly 1 MiB) is swapped with its gradient; the second (250000
    elements, 1000000 bytes, just under 1 MiB) stays in RAM, and so does its gradient."""
    p = _preset(_model(262_144, 250_000))
    cfg = _cfg(offload_optimizer=NVME, sub_group_size=262_144)
    assert swap_layout(p, cfg) == [(262_144, [262_144]), (0, [])]
    sw = swapped_counts(p, cfg)
    assert (sw.n_s, sw.n_g, sw.n, sw.largest_subgroup) == (262_144, 262_144, 512_144, 262_144)
    # optimizer state in RAM: nothing swapped
    assert swap_layout(p, _cfg(offload_optimizer={"device": "cpu"})) == []


def test_persistence_is_decided_in_parameters_order_within_the_model_threshold() -> None:
    """parameter_offload.py mark_persistent_parameters: in parameters() order, a parameter
    whose numel would take the persistent total past stage3_model_persistence_threshold is
    skipped; otherwise it is persistent when its numel is at most
    stage3_param_persistence_threshold, and only then counts towards the total.
    Thresholds 1.0e6 and 1.6e6; max_in_cpu 0 keeps every file on the drive."""
    p = _preset(_model(2_000_000, 1_200_000, 1_000_000, 600_000, 600_000), params="nvme")
    cfg = _cfg(
        offload_param={"device": "nvme", "max_in_cpu": 0},
        stage3_param_persistence_threshold=1_000_000,
        stage3_model_persistence_threshold=1_600_000,
    )
    assert parameter_placement(p, cfg) == [
        ON_NVME,  # 2.0e6 alone is past the model threshold
        ON_NVME,  # 1.2e6 is within it but above the parameter threshold: total stays 0
        PERSISTENT,  # 1.0e6, exactly the parameter threshold: total 1.0e6
        PERSISTENT,  # 0.6e6: total 1.6e6, exactly the model threshold
        ON_NVME,  # 0.6e6 more would make 2.2e6
    ]
    sw = swapped_counts(p, cfg)
    assert (sw.n_r, sw.n_k) == (5_400_000, 1_600_000)
    # without the model threshold the last one is persistent too
    unbounded = _cfg(
        offload_param={"device": "nvme", "max_in_cpu": 0},
        stage3_param_persistence_threshold=1_000_000,
    )
    assert parameter_placement(p, unbounded)[2:] == [PERSISTENT] * 3


def test_placement_only_with_the_parameters_on_nvme() -> None:
    p = _preset(_model(2_000_000, 1000))
    cpu = _cfg(offload_param={"device": "cpu", "max_in_cpu": 0})
    assert parameter_placement(p, cpu) == [NO_FILE, NO_FILE]
    assert not _param_subgroup_on_nvme(p, cpu)
    assert not _param_subgroup_on_nvme(p, {})
    assert parameter_placement(p, {}) == [NO_FILE, NO_FILE]


def test_max_in_cpu_default_and_boundaries() -> None:
    """DeepSpeed's max_in_cpu default is 1e9 elements (offload_config.py): a sub-group of
    exactly 1e9 fits the CPU buffer and is read into it once; one of 1e9 + 1 stays on the
    drive, and the write-back buffer exists."""
    fits = _preset(_model(BILLION), params="nvme")
    over = _preset(_model(BILLION + 1), params="nvme")
    cfg = _cfg(offload_param=NVME)
    assert parameter_placement(fits, cfg) == [IN_CPU]
    assert parameter_placement(over, cfg) == [ON_NVME]
    assert not _param_subgroup_on_nvme(fits, cfg)
    assert _param_subgroup_on_nvme(over, cfg)
    # an explicit budget: exactly the model fits, one element short does not
    two = _preset(_model(1_000_000, 1), params="nvme")
    at = {"device": "nvme", "max_in_cpu": 1_000_001}
    assert parameter_placement(two, _cfg(offload_param=at)) == [IN_CPU, NO_FILE]
    assert not _param_subgroup_on_nvme(two, _cfg(offload_param=at))
    short = {"device": "nvme", "max_in_cpu": 1_000_000}
    assert _param_subgroup_on_nvme(two, _cfg(offload_param=short))
    # a model of 2 elements and a budget of 1 does not fit; of 1 element with budget 0 it
    # fits the 1-element tensor DeepSpeed makes where nothing is kept
    assert _param_subgroup_on_nvme(_preset(_model(2)), _cfg(offload_param={**at, "max_in_cpu": 1}))
    assert not _param_subgroup_on_nvme(
        _preset(_model(1)), _cfg(offload_param={**at, "max_in_cpu": 0})
    )


# ----------------------------------------------------------------------------- host RAM

#: the model of the host RAM tests: 5001000 elements, 10002000 bf16 bytes
M1 = _model(4_000_000, 1_000_000, 1000)
N1 = 5_001_000


def _host(p: Preset, cfg: dict[str, Any]) -> HostRam:
    e = estimate(p, cfg)
    assert e.host is not None
    assert e.host_bytes == e.host.peak * e.ranks
    return e.host


def test_host_ram_without_offload_is_the_process_alone() -> None:
    host = _host(_preset(M1, optimizer="gpu"), _cfg())
    assert host == HostRam(PROCESS_BASE + CUDA_HOST, 0, 0, 0, 0, 0, 0, 0)
    assert host.peak == PROCESS_BASE + CUDA_HOST


def test_host_ram_optimizer_on_nvme_pinned() -> None:
    """Gradient partitions 2N = 10002000 bytes, pinned: 2**24; pinning copies, so the
    original coexists at initialisation. One sub-group (S_max = N): 4 swap buffers (the
    default buffer_count) of 4 S_max, and the first step's 8 S_max moments and 2 S_max
    staging."""
    host = _host(_preset(M1), _cfg(offload_optimizer={"device": "nvme", "pin_memory": True}))
    assert host.process == PROCESS_BASE + CUDA_HOST
    assert (host.gradients, host.init_transient) == (1 << 24, 10_002_000)
    assert host.swap_buffers == 4 * 4 * N1
    assert host.step_transient == 10 * N1
    assert (host.optimizer_state, host.param_buffers, host.model, host.collectives) == (0,) * 4
    assert host.steady == PROCESS_BASE + CUDA_HOST + (1 << 24) + 16 * N1
    assert host.peak == host.steady + 10 * N1
    assert host.dtype == "bf16"


def test_host_ram_optimizer_on_nvme_unpinned_with_six_buffers() -> None:
    """pin_memory defaults to false: the gradients are pageable, not rounded, not copied."""
    host = _host(_preset(M1), _cfg(offload_optimizer={"device": "nvme", "buffer_count": 6}))
    assert (host.gradients, host.init_transient) == (10_002_000, 0)
    assert host.swap_buffers == 6 * 4 * N1


def test_host_ram_in_fp32() -> None:
    """float32 gradients: 4N = 20004000 bytes, pinned 2**25; staging 4 S_max."""
    host = _host(
        _preset(M1), _cfg(bf16=False, offload_optimizer={"device": "nvme", "pin_memory": True})
    )
    assert (host.gradients, host.init_transient) == (1 << 25, 20_004_000)
    assert host.step_transient == 4 * N1 + 8 * N1
    assert host.dtype == "fp32"


def test_host_ram_optimizer_on_cpu_pinned() -> None:
    """sub_group_size 4e6: groups of 4000000 and 1001000 elements. fp32 master 4N and Adam's
    moments 8N, and each group's fp32 gradients pinned: 16000000 -> 2**24, 4004000 -> 2**22.
    Initialisation converts and clones the largest group: 8 x 4e6 (more than the 2N
    pinning copy); the step stages it as bf16: 2 x 4e6."""
    cfg = _cfg(offload_optimizer={"device": "cpu", "pin_memory": True}, sub_group_size=4_000_000)
    host = _host(_preset(M1, optimizer="cpu"), cfg)
    assert host.gradients == 1 << 24
    assert host.optimizer_state == 12 * N1 + (1 << 24) + (1 << 22)
    assert (host.init_transient, host.step_transient) == (32_000_000, 8_000_000)
    assert host.swap_buffers == 0


def test_host_ram_optimizer_on_cpu_unpinned() -> None:
    cfg = _cfg(offload_optimizer={"device": "cpu"}, sub_group_size=4_000_000)
    host = _host(_preset(M1, optimizer="cpu"), cfg)
    assert host.gradients == 10_002_000
    assert host.optimizer_state == 4 * N1 + 4 * N1 + 8 * N1
    assert host.init_transient == 32_000_000


def test_host_ram_parameters_on_nvme_defaults() -> None:
    """DeepSpeed's offload_param defaults: 5 buffers of 1e8 elements (bf16: 1e9 bytes), a
    CPU cache of min(N, 1e9) elements (the whole model: 2N pinned, 2**24) and no write-back
    buffer, every sub-group fitting the cache."""
    cfg = _cfg(offload_optimizer=NVME, offload_param=NVME)
    host = _host(_preset(M1, params="nvme"), cfg)
    assert host.param_buffers == 2 * 5 * 100_000_000 + (1 << 24)


def test_host_ram_parameters_on_nvme_explicit() -> None:
    """3 buffers of 2e6 elements; a cache of 1e6 elements (2e6 bytes, pinned 2**21); the
    one sub-group (N) does not fit it, so a 2 S_max write-back buffer."""
    op = {"device": "nvme", "buffer_count": 3, "buffer_size": 2_000_000, "max_in_cpu": 1_000_000}
    host = _host(_preset(M1, params="nvme"), _cfg(offload_optimizer=NVME, offload_param=op))
    assert host.param_buffers == 2 * 3 * 2_000_000 + (1 << 21) + 2 * N1
    # a cache of one element or none is not counted (DeepSpeed's 1-element tensor)
    for max_in_cpu in (0, 1):
        q = _cfg(offload_optimizer=NVME, offload_param={**op, "max_in_cpu": max_in_cpu})
        assert _host(_preset(M1, params="nvme"), q).param_buffers == 2 * 3 * 2_000_000 + 2 * N1


def test_host_ram_parameters_on_cpu() -> None:
    """offload_param cpu: the bf16 parameters in pinned memory, 2N -> 2**24 with CUDA; on a
    CPU run pin_memory is a no-op: 2N as it is."""
    cfg = _cfg(offload_optimizer={"device": "cpu"}, offload_param={"device": "cpu"})
    assert _host(_preset(M1, optimizer="cpu"), cfg).param_buffers == 1 << 24
    cpu = _host(_preset(M1, optimizer="cpu", accelerator="cpu"), cfg)
    assert cpu.param_buffers == 2 * N1


def test_host_ram_of_a_cpu_run() -> None:
    """A CPU run: no CUDA in the process; pin_memory changes nothing (no rounding, no copy);
    the bf16 model and its gradient bucket (2N + 2N) and the activations are in RAM."""
    acts = 1 * 4 * 8 * 2 + 4 * 224 * 2 + 4 * 100 * 12  # 1 layer, 4 tokens (see above)
    cfg = _cfg(offload_optimizer={"device": "cpu", "pin_memory": True})
    host = _host(_preset(M1, optimizer="cpu", accelerator="cpu"), cfg)
    assert host.process == PROCESS_BASE
    assert (host.gradients, host.init_transient) == (2 * N1, 8 * N1)  # the clone of 1 group
    assert host.optimizer_state == 16 * N1
    assert host.step_transient == 2 * N1
    assert host.model == 2 * N1 + 2 * N1 + acts
    # with the parameters on NVMe only the gradient bucket and activations stay
    nv = _cfg(offload_optimizer=NVME, offload_param={"device": "nvme", "max_in_cpu": 0})
    host = _host(_preset(M1, params="nvme", accelerator="cpu"), nv)
    assert host.model == 2 * N1 + acts
    # max_in_cpu 0: no cache; the one sub-group stays on the drive: write-back buffer 2N
    assert host.param_buffers == 2 * 5 * 100_000_000 + 2 * N1


def test_host_ram_collectives_of_two_cpu_ranks() -> None:
    """Two CPU ranks: each holds its partitions (ceil halves: 2000000 + 500000 + 501) and
    gathers the rest of each parameter in bf16 (5001001 - 2500501 elements), and maps both
    ranks' shared-memory workspaces (2 x 1 MiB + 2 x 32 MiB each)."""
    p = _preset(_model(4_000_000, 1_000_000, 1001), optimizer="cpu", accelerator="cpu", ranks=2)
    e = estimate(p, _cfg(offload_optimizer={"device": "cpu"}))
    assert e.host is not None and e.swapped.n == 2_500_501
    assert SHM_WORKSPACE == 69_206_016
    assert e.host.collectives == 2 * 2_500_500 + 2 * 69_206_016
    # the node holds both ranks
    assert e.host_bytes == 2 * e.host.peak


# ------------------------------------------------------------------------- estimate()


def test_a_config_without_zero_optimization_or_accumulation_takes_the_defaults() -> None:
    """No zero_optimization section: nothing offloaded, nothing swapped; the GPU holds the
    bf16 partitions (2N), DeepSpeed's default reduce bucket (5e8 elements, 10 x) and the
    activations."""
    p = _preset(_model(1000, 2000), optimizer="cpu")
    e = estimate(p, {"bf16": {"enabled": True}})
    sw = e.swapped
    assert (sw.n, sw.n_s, sw.n_g, sw.n_p, sw.n_r, sw.n_k) == (3000, 0, 0, 0, 0, 0)
    assert (sw.largest_subgroup, sw.largest_param) == (3000, 2000)
    zero = IoVolume(0, 0)
    assert (e.init, e.first_step, e.steady_step, e.nvme_bytes) == (zero, zero, zero, 0)
    acts = 6656  # 1 layer, 4 tokens: 64 + 1792 + 4800
    assert e.gpu_bytes == 2 * 3000 + 10 * 500_000_000 + acts + CUDA_RESERVE
    assert e.host_bytes == PROCESS_BASE + CUDA_HOST
    assert e.update_interval == 1 and e.first_update is None and not e.caveats


#: the model of the parameter-offload counts: two files (1e6 and 6e5 elements) and a norm
#: of 1000 that stays in RAM; one sub-group of 1601000
M3 = _model(1_000_000, 600_000, 1000)
NS3, NG3 = up(1_601_000), down(1_000_000) + down(600_000)
OPT3 = _opt(n_s=NS3, n_g=NG3)


def test_parameters_on_nvme_without_accumulation_key_or_reuse_distance() -> None:
    """N_p = N_r = 1.6e6 (max_in_cpu 0), no persistent one. Footprint 12 N_s + 4 N_g + 2 N_p.
    Initialisation: the optimizer's (4 N_s, 8 N_s), each file read twice (4 N_r) and written
    once more (2 N_r) besides zero.Init's write (2 N_p). First step: the trace's three reads
    (forward, recomputation, backward: 6 N_r). Steady step, one micro-step (no
    gradient_accumulation_steps: 1): forward and recomputation + backward share a fetch
    within DeepSpeed's default reuse distance (1e9 elements): 2 N_r. Both write 2 N_r."""
    p = _preset(M3, params="nvme")
    e = estimate(p, _cfg(offload_optimizer=NVME, offload_param={"device": "nvme", "max_in_cpu": 0}))
    sw = e.swapped
    assert (sw.n_p, sw.n_r, sw.n_k) == (1_600_000, 1_600_000, 0)
    assert e.nvme_bytes == 12 * NS3 + 4 * NG3 + 2 * 1_600_000
    assert e.init == IoVolume(4 * NS3 + 4 * 1_600_000, 8 * NS3 + 4 * 1_600_000)
    first, steady = OPT3
    assert e.first_step == first + IoVolume(6 * 1_600_000, 2 * 1_600_000)
    assert e.steady_step == steady + IoVolume(2 * 1_600_000, 2 * 1_600_000)
    assert not e.caveats  # untied
    # without checkpointing the trace has two reads (forward, backward)
    q = _preset(M3, params="nvme", checkpointing=False)
    e2 = estimate(
        q, _cfg(offload_optimizer=NVME, offload_param={"device": "nvme", "max_in_cpu": 0})
    )
    assert e2.first_step == first + IoVolume(4 * 1_600_000, 2 * 1_600_000)


@pytest.mark.parametrize(
    ("ga", "first_read", "steady_read"),
    [
        # ga 1: the trace (3 x 2 x 1.6e6) and the read after the step (2 x 6e5)
        (1, 9_600_000 + 1_200_000, 4_000_000 + 1_200_000),
        # ga 2: one more micro-step (4e6), which reads the persistent one again and keeps it
        (2, 9_600_000 + 4_000_000 + 1_200_000 + 1_200_000, 8_000_000 + 1_200_000),
        (3, 9_600_000 + 8_000_000 + 1_200_000 + 1_200_000, 12_000_000 + 1_200_000),
    ],
)
def test_a_persistent_parameter_on_the_drive_across_accumulation(
    ga: int, first_read: int, steady_read: int
) -> None:
    """M3 with stage3_param_persistence_threshold 6e5: the 6e5 file is persistent (N_k),
    the 1e6 one is fetched at each use (N_r - N_k = 1e6). stage3_max_reuse_distance 0: a
    micro-step fetches it twice (forward, then recomputation + backward): 4e6 bytes. The
    persistent one is read once after each optimizer step (2 N_k) and, in the first step,
    once more by the second micro-step's forward where there is one. Every step writes the
    drive's partitions back: 2 N_r."""
    p = _preset(M3, params="nvme")
    cfg = _cfg(
        ga=ga,
        offload_optimizer=NVME,
        offload_param={"device": "nvme", "max_in_cpu": 0},
        stage3_param_persistence_threshold=600_000,
        stage3_max_reuse_distance=0,
    )
    e = estimate(p, cfg)
    assert (e.swapped.n_r, e.swapped.n_k) == (1_600_000, 600_000)
    first, steady = OPT3
    assert e.first_step == first + IoVolume(first_read, 3_200_000)
    assert e.steady_step == steady + IoVolume(steady_read, 3_200_000)


def test_deepspeeds_default_reuse_distance_is_1e9_elements() -> None:
    """A parameter of 1e9 + 1 elements on the drive (above max_in_cpu's default 1e9), on a
    CPU run: with the default stage3_max_reuse_distance (1e9) one element of it is past the
    distance and fetched again: a micro-step reads 2 (N + N - 1e9) = 2N + 2 bytes. Host RAM:
    default buffers (1e9 bytes), the 1e9-element cache (2e9 bytes, a CPU run does not round)
    and the 2 S_max write-back buffer."""
    big = BILLION + 1
    p = _preset(_model(big), params="nvme", accelerator="cpu")
    e = estimate(p, _cfg(offload_optimizer=NVME, offload_param=NVME))
    assert (e.swapped.n_r, e.swapped.n_k, e.swapped.n_g) == (big, 0, down(big))
    opt = 12 * up(big) + 4 * down(big)
    assert e.steady_step == IoVolume(opt + 2 * big + 2, opt + 2 * big)
    assert e.gpu_bytes is None
    assert e.host is not None
    assert e.host.param_buffers == 2 * 5 * 100_000_000 + 2 * BILLION + 2 * big


def test_subgroups_under_the_minimum_swap_state_but_no_gradient() -> None:
    """Ten tensors of 2e5 elements (800000 fp32 bytes each, under 1 MiB) in one sub-group of
    2e6: the sub-group's master and moments are swapped (N_s = 2e6), no gradient is
    (N_g = 0)."""
    p = _preset(_model(*[200_000] * 10))
    e = estimate(p, _cfg(offload_optimizer=NVME))
    assert (e.swapped.n_s, e.swapped.n_g) == (up(2_000_000), 0) == (2_000_128, 0)
    assert e.nvme_bytes == 12 * up(2_000_000)
    assert e.init == IoVolume(4 * up(2_000_000), 8 * up(2_000_000))
    assert (e.first_step, e.steady_step) == _opt(up(2_000_000), 0)


def test_a_tied_weights_orphan_file_at_the_aio_minimum() -> None:
    """A tied lm_head of 524288 elements: zero.Init has written its 1 MiB bf16 file before
    transformers ties it: one more file, one more write at initialisation, no read; the
    steps are those of the untied twin. With the parameters on the drive the caveat says
    the tied weight's reads are uncertain."""
    op = {"device": "nvme", "max_in_cpu": 0}
    cfg = _cfg(offload_optimizer=NVME, offload_param=op)
    tied = estimate(_preset(_model(1_000_000, 600_000, 1000, tied=524_288), params="nvme"), cfg)
    twin = estimate(_preset(M3, params="nvme"), cfg)
    assert tied.nvme_bytes - twin.nvme_bytes == MIB
    assert tied.init == twin.init + IoVolume(0, MIB)
    assert (tied.first_step, tied.steady_step) == (twin.first_step, twin.steady_step)
    assert len(tied.caveats) == 1 and tied.caveats[0].startswith("tied weights")
    assert not twin.caveats
    # one element less: 1048574 bytes, under the minimum, no file
    small = estimate(_preset(_model(1_000_000, 600_000, 1000, tied=524_287), params="nvme"), cfg)
    assert small.nvme_bytes == twin.nvme_bytes and small.init == twin.init
    # the whole model in CPU memory (default max_in_cpu): the file stays, no caveat
    dflt = _cfg(offload_optimizer=NVME, offload_param=NVME)
    kept = estimate(_preset(_model(1_000_000, 600_000, 1000, tied=524_288), params="nvme"), dflt)
    assert kept.swapped.n_r == 0 and not kept.caveats
    assert kept.nvme_bytes - estimate(_preset(M3, params="nvme"), dflt).nvme_bytes == MIB


def test_a_tied_weights_orphan_is_partitioned_over_the_world() -> None:
    """Two nodes of one rank: the orphan's partition is ceil(1200001 / 2) = 600001 elements,
    1200002 bytes, over the minimum."""
    cfg = _cfg(offload_optimizer=NVME, offload_param={"device": "nvme", "max_in_cpu": 0})
    tied = _preset(_model(2_000_000, 1_200_000, tied=1_200_001), params="nvme", nodes=2)
    twin = _preset(_model(2_000_000, 1_200_000), params="nvme", nodes=2)
    a, b = estimate(tied, cfg), estimate(twin, cfg)
    assert a.world == 2 and a.ranks == 1
    assert a.nvme_bytes - b.nvme_bytes == 1_200_002
    assert a.init == b.init + IoVolume(0, 1_200_002)


# ------------------------------------------------------------------------ GPU memory


def test_gpu_bytes_with_the_optimizer_on_the_gpu() -> None:
    """Everything on the GPU: 21N (measured at 3B on an H100), activations, the reserve."""
    e = estimate(_preset(_model(1000, 2000), optimizer="gpu"), _cfg())
    assert e.gpu_bytes == 21 * 3000 + 6656 + CUDA_RESERVE


@pytest.mark.parametrize(
    ("sizes", "layers", "params", "held"),
    [
        # parameters on the GPU: the bf16 partitions, 2N
        ((1000, 2000), 1, "gpu", 2 * 3000),
        # on NVMe: 4 x 2 bytes x max(largest parameter, N / layers): one layer, N = 3001
        ((1001, 2000), 1, "nvme", 8 * 3001),
        # three layers, N = 10010: 10010 // 3 = 3336 elements a layer (above 1001)
        ((1001,) * 10, 3, "nvme", 8 * 3336),
        # the largest parameter (5000) is more than a layer's share (5100 // 2 = 2550)
        ((100, 5000), 2, "nvme", 8 * 5000),
    ],
)
def test_gpu_bytes_with_the_optimizer_offloaded(
    sizes: tuple[int, ...], layers: int, params: str, held: int
) -> None:
    """Besides the parameters held: the gradient bucket and its transients, 10 x
    reduce_bucket_size (1000 here), the activations (64 a layer + 6592, see above)."""
    p = _preset(_model(*sizes, layers=layers), optimizer="cpu", params=params)
    e = estimate(p, _cfg(reduce_bucket_size=1000))
    assert e.gpu_bytes == held + 10 * 1000 + 64 * layers + 6592 + CUDA_RESERVE


def test_gpu_bytes_with_zenflow_columns() -> None:
    """ZenFlow keeps the selected columns' bf16 moments and gradients on the GPU:
    topk_ratio x 6N (0.25 x 6 x 3000 = 4500; the default ratio 0.1: 1800)."""
    base = 2 * 3000 + 10 * 1000 + 6656 + CUDA_RESERVE
    p = _preset(_model(1000, 2000), zenflow=True)
    cfg = _cfg(offload_optimizer=NVME, reduce_bucket_size=1000, zenflow={"topk_ratio": 0.25})
    assert estimate(p, cfg).gpu_bytes == base + 4500
    cfg = _cfg(offload_optimizer=NVME, reduce_bucket_size=1000, zenflow={"update_interval": 1})
    assert estimate(p, cfg).gpu_bytes == base + 1800
    # no zenflow section at all: the default ratio, and no update schedule
    e = estimate(p, _cfg(offload_optimizer=NVME, reduce_bucket_size=1000))
    assert e.gpu_bytes == base + 1800 and e.update_interval == 1 and e.first_update is None


# ----------------------------------------------------------------------- ZenFlow I/O

#: M1 with the optimizer on NVMe: one sub-group of N1; the norm's gradient stays in RAM
OPT1 = _opt(n_s=up(N1), n_g=down(4_000_000) + down(1_000_000))


def _zen(zenflow: bool = True, ga: int | None = None, **block: Any) -> Estimate:
    return estimate(
        _preset(M1, zenflow=zenflow), _cfg(ga=ga, offload_optimizer=NVME, zenflow=block)
    )


def test_zenflow_updates_every_third_step() -> None:
    """update_interval 3 at ga 1: the offloaded step (and its swaps) runs every third step:
    the first update moves a first step's bytes, the later ones a steady step's, the steps
    between nothing; the mean over an interval is a third of it, in whole bytes."""
    first, steady = OPT1
    e = _zen(update_interval=3)
    assert e.update_interval == 3
    assert e.first_step == e.steady_step == IoVolume(0, 0)
    assert (e.first_update, e.update) == (first, steady)
    assert e.interval_mean(first=True) == IoVolume(first.read // 3, first.write // 3)
    assert e.interval_mean(first=False) == IoVolume(steady.read // 3, steady.write // 3)
    assert first.read % 3 and first.write % 3 and steady.read % 3  # the floor matters
    mean = e.interval_mean(first=True)
    assert mean is not None and isinstance(mean.read, int) and isinstance(mean.write, int)
    assert e.init == IoVolume(4 * up(N1), 8 * up(N1))
    # every second step: the steps between move nothing either
    e2 = _zen(update_interval=2)
    assert e2.update_interval == 2
    assert e2.first_step == e2.steady_step == IoVolume(0, 0)
    assert (e2.first_update, e2.update) == (first, steady)


def test_zenflow_every_step_is_a_plain_step() -> None:
    first, steady = OPT1
    for e in (_zen(update_interval=1), _zen()):  # a section without update_interval: 1
        assert e.update_interval == 1 and e.first_update is None and e.update is None
        assert (e.first_step, e.steady_step) == (first, steady)
        assert e.interval_mean(first=True) is None
    # a zenflow section in the config of a strategy without ZenFlow changes nothing
    plain = _zen(zenflow=False, update_interval=4)
    assert plain.update_interval == 1 and plain.first_update is None
    assert plain.first_step == first


@pytest.mark.parametrize("per_step", [2, 3])
def test_zenflow_several_updates_a_step(per_step: int) -> None:
    """update_interval 1 at ga 2 or 3: an offloaded update after every micro-step: the
    first step is a first update and per_step - 1 steady ones, a steady step per_step."""
    first, steady = OPT1
    e = _zen(ga=per_step, update_interval=1)
    assert e.update_interval == 1 and e.first_update is None
    assert e.first_step == first + steady * (per_step - 1)
    assert e.steady_step == steady * per_step


def test_the_host_ram_terms_are_printed_with_their_words() -> None:
    """`iotune estimate` prints each non-zero term of host RAM beside its words
    (render_plan.print_estimate); each term's words name what it holds, in this order, with
    the model's dtype where it is the model's."""
    host = HostRam(1, 2, 3, 4, 5, 6, 7, 8, collectives=9, dtype="fp32")
    assert host.terms() == [
        ("process (interpreter, torch, DeepSpeed; with CUDA its context)", 1),
        ("gradient partitions (fp32, pinned)", 2),
        ("optimizer state in RAM (fp32 master, gradients, Adam moments)", 3),
        ("optimizer swap buffers (locked)", 4),
        ("parameter swap buffers and CPU cache (locked)", 5),
        ("model and activations (CPU run)", 6),
        ("several ranks: gathered parameters, allreduce workspaces", 9),
        ("peak at initialisation: pinning copy of the gradients", 7),
        ("peak at the first step: new Adam moments, fp32 staging", 8),
    ]


def test_the_tied_weights_caveat_says_what_was_measured() -> None:
    """The caveat `estimate` prints for a tied weight with the parameters on the drive, word
    for word: what the model counts and what a tiny Qwen2 was seen to read."""
    cfg = _cfg(offload_optimizer=NVME, offload_param={"device": "nvme", "max_in_cpu": 0})
    e = estimate(_preset(_model(1_000_000, 600_000, 1000, tied=524_288), params="nvme"), cfg)
    assert e.caveats == (
        "tied weights with the parameters on NVMe: a step reads a tied weight's file 0 to "
        "2 times, where one is counted here (DeepSpeed keeps it gathered between its two "
        "uses, or not; a tiny Qwen2 read it 0, 1 and 2 times in three steps), and "
        "initialisation reads its file twice more",
    )


def test_swap_files_are_rounded_to_1024_bytes_as_two_ranks_wrote_them_in_the_vm() -> None:
    """The vm tier's cut tiny_opt_nvme (hidden 256, one layer, vocab 4096, fp32 on a CPU)
    on two ranks: each rank's sub-group is 917,888 elements, 3585.5 x 256, so its master's and
    moments' files hold 918,016 (DeepSpeed rounds a swap file up to 1024 bytes). Two ranks'
    copies of them in a checkpoint: 24 x 918,016 = 22,032,384 bytes, what the guest's save
    copied (tests/vm/test_checkpoint_vm.py; 3,072 bytes more than the unrounded count)."""
    from iotune.model.dsconfig import ds_config
    from iotune.model.presets import preset_with
    from iotune.model.swapfiles import swap_alignment

    sets = (
        "seq_len=2",
        "model.num_hidden_layers=1",
        "model.hidden_size=256",
        "model.intermediate_size=768",
        "model.vocab_size=4096",
        "ranks=2",
    )
    p = preset_with("tiny_opt_nvme", sets)
    cfg = ds_config(p)
    sw = estimate(p, cfg).swapped
    assert sw.n == 917_888 and sw.n_s == 918_016 == up(917_888)
    assert 2 * 12 * sw.n_s == 22_032_384
    # the alignment scales with the aio op's threads: 1024 bytes each
    assert swap_alignment(cfg) == 256
    assert swap_alignment({"aio": {"intra_op_parallelism": 2}}) == 512
    assert swap_alignment({"aio": {"intra_op_parallelism": 4}}) == 1024


def test_a_gradient_whose_aligned_part_is_under_the_aio_minimum_stays_in_ram() -> None:
    """aio.block_size 1,048,580 bytes: the minimum is 262,145 fp32 elements. A gradient of
    262,200 elements is over it, but its aligned part, 1024 x 256 = 262,144 elements, is not,
    and DeepSpeed asks that of the part it would swap (is_swappable_tensor after
    _adjust_for_misaligned_lengths): no gradient file. One of 262,400 (1025 x 256) is swapped
    whole."""
    cfg = _cfg(offload_optimizer=NVME)
    cfg["aio"] = {"block_size": 1_048_580}
    kept = estimate(_preset(_model(262_200, 300_000)), cfg)
    assert kept.swapped.n_g == down(300_000) == 299_776
    swapped = estimate(_preset(_model(262_400, 300_000)), cfg)
    assert swapped.swapped.n_g == 262_400 + 299_776


def test_the_reduce_bucket_is_the_configs_or_deepspeeds_default() -> None:
    """The gradient bucket the planner's gradients' tail is cut by: the config's
    zero_optimization.reduce_bucket_size, DeepSpeed's 500,000,000 elements where it has
    none (stage3.py's default), at least one element."""
    from iotune.model.dsconfig import ds_config
    from iotune.model.presets import get_preset

    p = get_preset("opt_nvme_1b")
    cfg = ds_config(p)
    cfg["zero_optimization"].pop("reduce_bucket_size", None)
    assert estimate(p, cfg).reduce_bucket == 500_000_000
    for asked in (1, 2, 123_456_789):
        cfg["zero_optimization"]["reduce_bucket_size"] = asked
        assert estimate(p, cfg).reduce_bucket == asked
    cfg["zero_optimization"]["reduce_bucket_size"] = 0
    assert estimate(p, cfg).reduce_bucket == 1


def test_a_resumed_runs_initialisation_and_first_step_by_hand() -> None:
    """A resume of an NVMe-offloaded optimizer (iotune.model.estimate.resumed_init_first): a
    fresh start's initialisation (4N read, 8N written), the save's swap files copied back
    (12N written; a clone none), DeepSpeed's reload of the fp32 master (4N read and written),
    and a first step that swaps Adam's moments in as a steady one does."""
    from iotune.model.estimate import resumed_init_first

    n = up(2_000_000)  # one tensor of 2e6 elements: its master's file
    e = estimate(_preset(_model(2_000_000)), _cfg(offload_optimizer=NVME))
    assert e.init == IoVolume(4 * n, 8 * n)
    steady = _opt(n, down(2_000_000))[1]
    assert resumed_init_first(e, "aio", False) == IoVolume(8 * n, 24 * n) + steady
    assert resumed_init_first(e, "deepspeed", False) == IoVolume(8 * n, 24 * n) + steady
    # cloned: no bytes copied back, from the offload volume's own file system or not
    assert resumed_init_first(e, "reflink", True) == IoVolume(8 * n, 12 * n) + steady
    assert resumed_init_first(e, "reflink", False) == IoVolume(8 * n, 12 * n) + steady
    # the copy's reads on the offload drives themselves: not modelled
    assert resumed_init_first(e, "aio", True) is None
    # two ranks on the node: twice one rank's
    two = estimate(_preset(_model(2_000_000), ranks=2), _cfg(offload_optimizer=NVME))
    one = resumed_init_first(two, "aio", False)
    assert one is not None and two.per_rank(one) == IoVolume(8, 24) * up(1_000_000) + IoVolume(
        12 * up(1_000_000) + 4 * down(1_000_000), 12 * up(1_000_000) + 4 * down(1_000_000)
    )
    # not modelled: the parameters on NVMe too, an optimizer in RAM
    both = estimate(
        _preset(_model(2_000_000), params="nvme"),
        _cfg(offload_optimizer=NVME, offload_param=NVME),
    )
    assert resumed_init_first(both, "aio", False) is None
    ram = estimate(_preset(_model(2_000_000), optimizer="cpu"), _cfg())
    assert resumed_init_first(ram, "aio", False) is None
    # nor ZenFlow, whose updates come every few steps
    zen = estimate(
        _preset(_model(2_000_000), zenflow=True),
        _cfg(offload_optimizer=NVME, zenflow={"update_interval": 4}),
    )
    assert zen.update_interval == 4 and resumed_init_first(zen, "aio", False) is None
