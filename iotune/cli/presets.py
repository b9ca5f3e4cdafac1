"""`iotune presets`: the training presets (configs/presets.toml), listed with their estimated
needs, or one shown with its DeepSpeed config and I/O model."""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from iotune.cli.options import STATE, json_option
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
    from iotune.model.dsconfig import ds_config
    from iotune.model.estimate import estimate
    from iotune.model.presets import load_presets
    from iotune.plan.render import presets_json, presets_table

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
        emit_json(presets_json(rows))
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
    from iotune.model.dsconfig import ds_config
    from iotune.model.estimate import estimate
    from iotune.model.presets import preset_with
    from iotune.plan.render import print_estimate

    p = preset_with(name, sets)
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
