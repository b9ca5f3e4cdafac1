"""`iotune estimate` and `iotune run`: a preset's or a user's model's predicted needs, and
offloaded training runs (iotune.cli.running, which `iotune trace --run` shares). The presets
themselves: iotune.cli.presets."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import click

from iotune.cli.options import (
    STATE,
    json_option,
    model_options,
    run_options,
)
from iotune.errors import UsageError
from iotune.render import console, emit_json


@click.command("estimate")
@click.argument("preset", required=False)
@model_options
@click.option(
    "--ranks",
    type=click.IntRange(1, 1024),
    help="Data-parallel ranks on the node (each swaps its own partitions; default 1).",
)
@click.option(
    "--nodes",
    type=click.IntRange(1, 100_000),
    help="Nodes of --ranks ranks each: ZeRO partitions the model over all their ranks, and "
    "each node swaps its own ranks' partitions on its own drives; the drives, their writes "
    "and the checkpoint volume are a node's (default 1).",
)
@click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Overrides, as for 'iotune run'."
)
@click.option(
    "--aio-config",
    type=click.Path(),
    help="aio block from a sweep-aio run or a DeepSpeed config; a sweep's measured bandwidth "
    "also predicts the optimizer's time.",
)
@click.option(
    "--threads-config",
    type=click.Path(),
    help="A sweep-threads run: CPU Adam's measured time per parameter.",
)
@click.option(
    "--baseline",
    metavar="RUN|study",
    help="Forward + backward from a run of the same model and batch: an NVMe run (which also "
    "times CPU Adam and its drives), a RAM run, a GPU-only run; 'study' takes the seed study's "
    "figures for its 16B model.",
)
@click.option(
    "--drives",
    metavar="K,K,...",
    help="Plan drives: the step on a RAID0 of each K drives like the one swept, run on or "
    "described by --drive (default 1,2,4,8 with --drive or --target-step).",
)
@click.option(
    "--drive",
    "drive",
    metavar="SPEC",
    help="A drive by its datasheet: a profile of configs/drives.toml (samsung-980-pro-2tb, "
    "wd-black-sn770-2tb, ...) or keys: 'read=7.0GB/s,write=5.1GB/s,link=16GT/s x4,"
    "capacity=2TB,tbw=1200TB' (also dwpd=, warranty_years=, cache=, after_cache=).",
)
@click.option(
    "--target-step",
    metavar="SECONDS|Nx",
    help="With --drives: the fewest drives whose predicted step is at most SECONDS, or N "
    "times the step without drive waits (1.5x); and what stops more drives from helping.",
)
@click.option(
    "--link",
    metavar="'16.0 GT/s x4'",
    help="Each drive's PCIe link for --drives (default: the datasheet's, or the swept drive's).",
)
@click.option(
    "--network-link",
    metavar="RATE",
    help="For NVMe-oF drives: the network link in front of all of them (100G, 25GbE); "
    "default: the swept drives' own, where they are fabrics namespaces.",
)
@click.option(
    "--memory-bw",
    type=float,
    metavar="GIB_S",
    help="The host's memory bandwidth in GiB/s, a ceiling for --drives (default: none).",
)
@click.option(
    "--cpu",
    metavar="NAME[,sockets=N]",
    help="The node's CPUs, for CPU Adam with --ranks side by side and the memory bandwidth: a "
    "name from configs/cpus.toml (amd-epyc-9654,sockets=2), or their figures "
    "(cores=64,channels=12,mts=4800).",
)
@click.option(
    "--chunk",
    metavar="SIZE",
    help="The RAID0 chunk for --drives (default 512K, mdadm's): with DeepSpeed's requests in "
    "flight it bounds how many members work at once.",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(1),
    metavar="M",
    help="Plan checkpoints: a save every M steps on a RAID5/6 of --checkpoint-drive drives; "
    "each width's save time and share of the training, and the narrowest under "
    "--checkpoint-share.",
)
@click.option(
    "--checkpoint-drive",
    metavar="SPEC",
    help="The checkpoint array's drives, as --drive takes them (default: --drive's); their "
    "writes derated by DeepSpeed's published ratio, or by the measured one where --drive names "
    "the same kind and a sweep or run measured it.",
)
@click.option(
    "--checkpoint-level",
    type=click.Choice(["5", "6"]),
    default="6",
    show_default=True,
    help="The checkpoint array's RAID level.",
)
@click.option(
    "--checkpoint-sweep",
    metavar="RUN",
    type=click.Path(),
    help="A sweep-checkpoint run: of the checkpoint volume, each writer's save on it (torch, "
    "fast with DeepSpeed's defaults and tuned, decoupled); with --copy-from, each copy of the "
    "swap files a save of NVMe-offloaded state makes (deepspeed, aio, reflink).",
)
@click.option(
    "--checkpoint-share",
    default="5%",
    show_default=True,
    metavar="PCT",
    help="The most of the training's time the saves may take.",
)
@json_option
def estimate_cmd(
    preset: str | None,
    model: str | None,
    ds_config: str | None,
    micro_batch: int | None,
    seq_len: int | None,
    ga: int | None,
    ranks: int | None,
    nodes: int | None,
    sets: tuple[str, ...],
    aio_config: str | None,
    threads_config: str | None,
    baseline: str | None,
    drives: str | None,
    drive: str | None,
    target_step: str | None,
    link: str | None,
    memory_bw: float | None,
    network_link: str | None,
    cpu: str | None,
    chunk: str | None,
    checkpoint_every: int | None,
    checkpoint_drive: str | None,
    checkpoint_level: str,
    checkpoint_share: str,
    checkpoint_sweep: str | None,
) -> None:
    """Predict NVMe space and bytes read/written per step for PRESET, from DeepSpeed's swap logic.

    \b
    With N parameters and the optimizer state on NVMe: footprint 16N bytes,
    initialisation + first step reads 12N and writes 24N, each later step
    reads 16N and writes 16N. Parameter offload adds 2N of bf16 files and the
    parameter fetches of forward, recomputation and backward. Tensors under
    max(1 MiB, aio block) stay in RAM, which matters only for small models.
    'iotune trace --run PRESET' prints this prediction next to the measurement.

    \b
    Your own model and DeepSpeed config instead of a preset:
    iotune estimate --model ./my-model --ds-config ds_config.json --seq-len 4096
    The model's parameter tensors come from its config.json (built by transformers
    on the meta device: nothing is allocated or downloaded), the config is read as
    DeepSpeed reads it, and settings that cost something are pointed out (advice).

    \b
    Step time, from measurements (the study: offloaded steps are bandwidth-bound):
    iotune estimate opt_nvme_1b --aio-config SWEEP_RUN --threads-config THREADS_RUN \\
        --baseline OPT_RAM_RUN
    The optimizer step is its reads at the sweep's read bandwidth, CPU Adam at the
    thread sweep's rate, and its writes at the write bandwidth, one after the other
    as DeepSpeed swaps; the step adds the baseline's forward + backward and the
    gradients written during backward.
    """
    from iotune.model import dsconfig
    from iotune.model.custom import pick_preset
    from iotune.model.estimate import estimate
    from iotune.plan.advice import advise
    from iotune.plan.measured import measured_inputs
    from iotune.plan.predict import predict
    from iotune.plan.render import print_estimate
    from iotune.records import load_aio
    from iotune.train.render import print_prediction

    p = pick_preset(
        preset,
        model,
        ds_config,
        micro_batch=micro_batch,
        seq_len=seq_len,
        ga=ga,
        ranks=ranks,
        sets=(
            *sets,
            *((f"ranks={ranks}",) if ranks else ()),
            *((f"nodes={nodes}",) if nodes else ()),
        ),
    )
    aio, _ = load_aio(aio_config)
    cfg = dsconfig.ds_config(p, aio=aio)
    e = estimate(p, cfg)
    bw, adam, base = measured_inputs(p, cfg, aio_config, threads_config, baseline)
    node = None
    if cpu is not None:
        from iotune.plan.cpus import node_adam, parse_cpu

        node = parse_cpu(cpu)
        adam = node_adam(adam, node, e.ranks)
    pred = predict(p, e, bw, adam, base) if bw or adam or base else None
    advice = advise(p, cfg, e, aio_config=aio_config)
    plan = None
    if network_link and not (drives or drive or target_step is not None):
        raise UsageError(
            "--network-link bounds a drives plan", hint="--drives 1,2,4 --network-link 100G"
        )
    if drives or drive or target_step is not None:
        from pathlib import Path

        from iotune.plan.planner import plan_storage
        from iotune.records import threads_memory

        plan = plan_storage(
            p,
            e,
            cfg,
            bw=bw,
            adam=adam,
            base=base,
            aio_config=aio_config,
            baseline=baseline,
            drive=drive,
            drives=drives,
            target=target_step,
            link=link,
            memory_bw=memory_bw,
            chunk=chunk,
            network=network_link,
            cpu=node,
            memory_measured=threads_memory(Path(threads_config)) if threads_config else None,
        )
    ckp = None
    if checkpoint_every is not None or checkpoint_sweep:
        from iotune.plan.ckplan import plan_for_estimate
        from iotune.train.checkpoint import save_volume

        ckp = plan_for_estimate(
            p,
            plan,
            pred,
            bw,
            base,
            save_bytes=save_volume(e, p.strategy.optimizer == "nvme").write,
            drive=drive,
            checkpoint_drive=checkpoint_drive,
            every=checkpoint_every,
            level=int(checkpoint_level),
            share=checkpoint_share,
            sweep=checkpoint_sweep,
        )
    if STATE.json:
        emit_json(
            {
                "preset": p.name,
                "params": e.params,
                **asdict(e),
                "init_first": asdict(e.init_first),
                "prediction": pred.to_json() if pred else None,
                "advice": [a.to_json() for a in advice],
                "auto_filled": [
                    {"key": k, "value": json.loads(v), "from": src} for k, v, src in p.ds_filled
                ],
                **({"drives": plan} if plan else {}),
                **({"checkpoints": ckp} if ckp else {}),
            }
        )
    else:
        print_estimate(console(), p, e, cfg)
        for a in advice:
            console().print(f"  [yellow]advice[/]    {a.setting}: {a.text}", soft_wrap=True)
        if pred and (plan is None or pred.optimizer_s is not None):
            print_prediction(console(), pred.to_json())
        if plan:
            from iotune.plan.render import print_drive_plan

            print_drive_plan(console(), plan)
        if ckp:
            from iotune.plan.render import print_checkpoint_plan

            print_checkpoint_plan(console(), ckp)


@click.command("run")
@click.argument("preset", required=False)
@run_options
@click.option(
    "--out", type=click.Path(), help="Run directory (default results/run-PRESET-DATE-TIME)."
)
@json_option
def run_cmd(preset: str | None, out: str | None, **kw: Any) -> None:
    """Run DeepSpeed-offloaded training steps of PRESET and print the study's table.

    \b
    iotune run tiny_opt_nvme                        # CPU-only host, any drive
    iotune run opt_nvme_1b --nvme-path /mnt/nvme0 --steps 5
    iotune run opt_raid0_3b_ga8 --aio-config results/sweep-...
    iotune run opt_nvme_8b --ranks 8 --nvme-path /mnt/nvme0,/mnt/nvme1
    iotune run --model ./my-model --ds-config ds.json --seq-len 4096 --steps 3

    Before anything is allocated, the preset's GPU memory, host RAM and NVMe
    space are estimated and the run is refused if they do not fit (--force
    runs anyway). The worker reports every step (forward, backward, optimizer,
    tokens/s, loss, peak memory); the drives behind the offload path are
    measured with the kernel's counters. 'iotune trace --run PRESET' does the
    same with eBPF request sizes. --ranks N runs N ranks through DeepSpeed's
    launcher (one per GPU; gloo processes on a CPU host), --hostfile several
    nodes; the table then adds each rank's figures.
    """
    from iotune.cli.running import run_preset

    run_preset(preset, "diskstats", out, **kw)
