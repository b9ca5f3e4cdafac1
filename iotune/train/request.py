"""What a training run is asked to do (:class:`RunRequest`), built from the options of `iotune
run` and `iotune trace --run` (:func:`make_request`), and what preparing it found
(:class:`Prepared`): the preset resolved, its DeepSpeed config, estimate, resources and
offload directories."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iotune.errors import UsageError
from iotune.model.estimate import Estimate
from iotune.model.presets import Dtype, Preset
from iotune.plan.measured import AdamRate, Bandwidth, Baseline
from iotune.train.checkpoint import Checkpointing
from iotune.train.launch import Launch
from iotune.train.preflight import Gpus, Resources, Shortfall

if TYPE_CHECKING:
    from iotune.trace.targets import Array


@dataclass
class RunRequest:
    preset: Preset
    out: Path
    backend: str  # "libbpf" | "bcc" | "diskstats"
    nvme_paths: list[Path] = field(default_factory=list)  # none: the preset's
    aio: dict[str, Any] | None = None
    aio_source: str = "preset"
    data: Path | None = None
    tokenizer: Path | None = None
    force: bool = False
    keep_swap: bool = False
    quiet_stdout: bool = False
    interval: float = 1.0
    focus: int | None = None  # counted apart; default: the aio block size
    progress: bool = False  # a line on stderr at initialisation and after every step
    notes: list[str] = field(default_factory=list)
    # step-time prediction: measured AIO bandwidth, CPU Adam rate, a baseline's fwd+bwd
    bandwidth: Bandwidth | None = None
    adam: AdamRate | None = None
    baseline: Baseline | None = None
    gpu: Gpus | None = None  # the GPUs, when already probed
    launch: Launch | None = None  # several ranks or nodes: DeepSpeed's launcher
    checkpoint: Checkpointing | None = None  # saves every N steps, where and with which writer
    resume_from: Path | None = None  # a checkpoint of this model to start from
    #: how a save copies an optimizer's swap files into the checkpoint, and a resume back
    #: (iotune/workers/swapcopy.py: aio, reflink, deepspeed)
    swap_copy: str = "deepspeed"


@dataclass
class Prepared:
    preset: Preset
    cfg: dict[str, Any]
    est: Estimate
    res: Resources
    shortfalls: list[Shortfall]
    nvme_path: Path | None
    swap_dir: Path | None
    targets: Any
    nvme_paths: list[Path] = field(default_factory=list)  # the offload directories given
    swap_dirs: list[Path] = field(default_factory=list)  # one per rank of this node
    placement: str = "round robin"  # how ranks were given directories: or "numa"
    dtype: Dtype | None = None  # the model's dtype and why
    resume: tuple[Path, str] | None = None  # the checkpoint's folder and tag to load
    offload_drives: tuple[str, ...] = ()  # the drives under the swap folders
    checkpoint_drives: tuple[str, ...] = ()  # the drives under --checkpoint-dir
    checkpoint_array: Array | None = None  # the md array under --checkpoint-dir
    persist_drives: tuple[str, ...] = ()  # the drives under --checkpoint-persist
    persist_array: Array | None = None  # the md array under --checkpoint-persist


def make_request(
    name: str | None,
    backend: str,
    out: str | None,
    nvme_path: str | None,
    steps: int | None,
    sets: tuple[str, ...],
    data: str | None,
    tokenizer: str | None,
    aio_config: str | None,
    force: bool,
    keep_swap: bool,
    *,
    interval: float = 1.0,
    focus: int | None = None,
    ranks: int | None = None,
    hostfile: str | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    launcher: str | None = None,
    model: str | None = None,
    ds_config: str | None = None,
    micro_batch: int | None = None,
    seq_len: int | None = None,
    ga: int | None = None,
    quiet: bool = False,
    checkpoint_every: int | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_writer: str | None = None,
    resume_from: str | None = None,
    checkpoint_copy: str = "deepspeed",
    checkpoint_persist: str | None = None,
) -> RunRequest:
    """The run the options ask for: the preset (or the user's model and config), the
    launch, the offload directories, the aio block, the run directory, the data. Refuses
    what makes no sense before anything is prepared."""
    from iotune.model.custom import pick_preset
    from iotune.records import load_aio
    from iotune.train.data import check_inputs
    from iotune.train.launch import check_nodes, plan_launch

    launch = plan_launch(ranks, hostfile, node_rank, master_addr, launcher)
    if launch is not None:
        check_nodes(launch)
    preset = pick_preset(
        name,
        model,
        ds_config,
        micro_batch=micro_batch,
        seq_len=seq_len,
        ga=ga,
        ranks=launch.ranks if launch is not None else None,
        sets=sets,
        steps=steps,
    )
    if launch is not None:
        preset = replace(preset, ranks=launch.ranks, nodes=launch.nodes)
    paths = [Path(x) for x in nvme_path.split(",") if x] if nvme_path else []
    aio, aio_source = load_aio(aio_config)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = (Path(out) if out else Path("results") / f"run-{preset.name}-{stamp}").resolve()
    if launch is not None and launch.node_rank is not None:
        # every node runs this command: each keeps its records under its own name
        out_dir = out_dir / str(launch.node)
    check_inputs(data, tokenizer)
    if (checkpoint_every is None) != (checkpoint_dir is None):
        given = "--checkpoint-every" if checkpoint_every is not None else "--checkpoint-dir"
        raise UsageError(
            f"{given} needs its partner: a save every N steps goes into a folder",
            hint="--checkpoint-every 1 --checkpoint-dir /mnt/ckpt",
        )
    ck = (
        Checkpointing(
            int(checkpoint_every),
            Path(checkpoint_dir).resolve(),
            checkpoint_writer or "torch",
            writer_given=checkpoint_writer is not None,
            persist=Path(checkpoint_persist).resolve() if checkpoint_persist else None,
        )
        if checkpoint_every is not None and checkpoint_dir is not None
        else None
    )
    if checkpoint_persist and ck is None:
        raise UsageError(
            "--checkpoint-persist copies each save taken by --checkpoint-every into its folder",
            hint="--checkpoint-every 1 --checkpoint-dir /mnt/offload/snap --checkpoint-copy "
            "reflink --checkpoint-persist /mnt/ckpt",
        )
    return RunRequest(
        preset=preset,
        out=out_dir,
        backend=backend,
        nvme_paths=paths,
        aio=aio,
        aio_source=aio_source,
        data=Path(data) if data else None,
        tokenizer=Path(tokenizer) if tokenizer else None,
        force=force,
        keep_swap=keep_swap,
        quiet_stdout=quiet,
        interval=interval,
        focus=focus,
        progress=not quiet,
        launch=launch,
        checkpoint=ck,
        resume_from=Path(resume_from).resolve() if resume_from else None,
        swap_copy=checkpoint_copy,
    )
