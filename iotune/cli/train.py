"""`iotune presets`, `iotune estimate` and `iotune run`: the training presets, their predicted
needs and offloaded training runs."""

from __future__ import annotations

import json
from typing import Any

import click

from iotune.cli.options import (
    STATE,
    _preset_with,
    _run_preset,
    json_option,
    run_options,
)
from iotune.errors import UsageError
from iotune.render import console, emit_json


@click.group("presets", invoke_without_command=True)
@click.pass_context
def presets_group(ctx: click.Context) -> None:
    """The training presets: the study's experiments and small CPU ones (configs/presets.toml).

    \b
    iotune presets list              every preset with parameters and estimated needs
    iotune presets show opt_nvme_16b one preset: geometry, DeepSpeed config, I/O model
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(presets_list)


@presets_group.command("list")
@click.option("--strategy", help="Only this strategy (e.g. opt_nvme).")
@click.option("--size", help="Only this size (e.g. 16b, tiny).")
@json_option
def presets_list(strategy: str | None, size: str | None) -> None:
    """Every preset: parameter count, geometry, strategy, accumulation and estimated needs."""
    from iotune.train.estimate import estimate
    from iotune.train.presets import ds_config, load_presets
    from iotune.train.render import presets_table

    rows = []
    for p in load_presets().values():
        if (strategy and p.strategy.name != strategy) or (size and p.size != size):
            continue
        rows.append((p, estimate(p, ds_config(p))))
    if not rows:
        raise UsageError(
            "no preset matches", hint="'iotune presets list' without filters shows them all"
        )
    if STATE.json:
        emit_json(
            [
                {
                    "name": p.name,
                    "size": p.size,
                    "strategy": p.strategy.name,
                    "params": e.params,
                    "geometry": p.geometry.llama_config(),
                    "ga": p.ga,
                    "seq_len": p.seq_len,
                    "accelerator": p.accelerator,
                    "nvme_bytes": e.nvme_bytes,
                    "gpu_bytes": e.gpu_bytes,
                    "host_bytes": e.host_bytes,
                }
                for p, e in rows
            ]
        )
    else:
        console().print(presets_table(rows))


@presets_group.command("show")
@click.argument("name")
@click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Overrides, as for 'iotune run'."
)
@json_option
def presets_show(name: str, sets: tuple[str, ...]) -> None:
    """One preset: geometry, parameter count, the DeepSpeed config it runs with, its I/O model."""
    from dataclasses import asdict

    from iotune.train.estimate import estimate
    from iotune.train.presets import ds_config
    from iotune.train.render import print_estimate

    p = _preset_with(name, sets, None)
    cfg = ds_config(p)
    e = estimate(p, cfg)
    if STATE.json:
        emit_json(
            {"preset": asdict(p), "params": e.params, "ds_config": cfg, "estimate": asdict(e)}
        )
        return
    con = console()
    print_estimate(con, p, e, cfg)
    con.print("DeepSpeed config:")
    con.print_json(json.dumps(cfg))


@click.command("estimate")
@click.argument("preset")
@click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Overrides, as for 'iotune run'."
)
@click.option(
    "--aio-config", type=click.Path(), help="aio block from a sweep-aio run or a DeepSpeed config."
)
@json_option
def estimate_cmd(preset: str, sets: tuple[str, ...], aio_config: str | None) -> None:
    """Predict NVMe space and bytes read/written per step for PRESET, from DeepSpeed's swap logic.

    \b
    With N parameters and the optimizer state on NVMe: footprint 16N bytes,
    initialisation + first step reads 12N and writes 24N, each later step
    reads 16N and writes 16N. Parameter offload adds 2N of bf16 files and the
    parameter fetches of forward, recomputation and backward. Tensors under
    max(1 MiB, aio block) stay in RAM, which matters only for small models.
    'iotune trace --run PRESET' prints this prediction next to the measurement.
    """
    from dataclasses import asdict

    from iotune.sweep.result import load_aio
    from iotune.train.estimate import estimate
    from iotune.train.presets import ds_config
    from iotune.train.render import print_estimate

    p = _preset_with(preset, sets, None)
    aio, _ = load_aio(aio_config)
    cfg = ds_config(p, aio=aio)
    e = estimate(p, cfg)
    if STATE.json:
        emit_json(
            {"preset": p.name, "params": e.params, **asdict(e), "init_first": asdict(e.init_first)}
        )
    else:
        print_estimate(console(), p, e, cfg)


@click.command("run")
@click.argument("preset")
@run_options
@click.option(
    "--out", type=click.Path(), help="Run directory (default results/run-PRESET-DATE-TIME)."
)
@json_option
def run_cmd(preset: str, out: str | None, **kw: Any) -> None:
    """Run DeepSpeed-offloaded training steps of PRESET and print the study's table.

    \b
    iotune run tiny_opt_nvme                        # CPU-only host, any drive
    iotune run opt_nvme_1b --nvme-path /mnt/nvme0 --steps 5
    iotune run opt_raid0_3b_ga8 --aio-config results/sweep-...

    Before anything is allocated, the preset's GPU memory, host RAM and NVMe
    space are estimated and the run is refused if they do not fit (--force
    runs anyway). The worker reports every step (forward, backward, optimizer,
    tokens/s, loss, peak memory); the drives behind the offload path are
    measured with the kernel's counters. 'iotune trace --run PRESET' does the
    same with eBPF request sizes.
    """
    _run_preset(preset, "diskstats", out, **kw)
