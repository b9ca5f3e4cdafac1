"""Shared pieces of the commands: the --json flag, option-value parsers and the options of a
training run (shared by `iotune run` and `iotune trace --run`)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from iotune.errors import UsageError
from iotune.render import console, emit_json, err_console, warn


@dataclass
class State:
    json: bool = False
    debug: bool = False


STATE = State()


def json_option(f: Any) -> Any:
    def callback(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        if value:
            STATE.json = True
        return value

    return click.option(
        "--json",
        "json_out",
        is_flag=True,
        expose_value=False,
        callback=callback,
        help="Print one JSON document on stdout instead of tables.",
    )(f)


def _list(text: str, parse: Any, what: str) -> tuple[Any, ...]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"{what}: give at least one value", hint=f"e.g. {what} 1,2,4")
    return tuple(dict.fromkeys(parse(t) for t in items))


def _bool(text: str) -> bool:
    low = text.lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise UsageError(f"{text!r} is not true or false", hint="e.g. --single-submit false,true")


def _posint(what: str) -> Any:
    def parse(text: str) -> int:
        if not text.isdigit() or int(text) <= 0:
            raise UsageError(
                f"{what}: {text!r} is not a positive whole number", hint=f"e.g. {what} 4,8,16"
            )
        return int(text)

    return parse


def _preset_with(name: str, sets: tuple[str, ...], steps: int | None) -> Any:
    from iotune.train.presets import apply_sets, get_preset, parse_sets

    preset = get_preset(name)
    overrides = parse_sets(sets)
    if steps is not None:
        overrides["steps"] = steps
    return apply_sets(preset, overrides)


def run_options(f: Any) -> Any:
    for opt in reversed(
        [
            click.option(
                "--nvme-path", type=click.Path(), help="Offload directory (default: the preset's)."
            ),
            click.option(
                "--steps",
                type=click.IntRange(1, 100000),
                help="Optimizer steps (default: the preset's).",
            ),
            click.option(
                "--set",
                "sets",
                multiple=True,
                metavar="KEY=VALUE",
                help="Override a preset field (steps, ga, seq_len, micro_batch, accelerator...), "
                "model.FIELD, or ds.a.b in the DeepSpeed config. Repeatable.",
            ),
            click.option(
                "--data",
                type=click.Path(),
                help="A local .txt, .jsonl or .parquet file (e.g. WikiText-2) tokenized and packed "
                "into seq_len blocks; default: synthetic tokens.",
            ),
            click.option(
                "--tokenizer",
                type=click.Path(),
                help="A local Hugging Face tokenizer directory for --data (default: UTF-8 bytes).",
            ),
            click.option(
                "--aio-config",
                type=click.Path(),
                help="Take the aio block from a sweep-aio run directory or a DeepSpeed config.",
            ),
            click.option(
                "--force",
                is_flag=True,
                help="Run even when the preflight estimate says it will not fit.",
            ),
            click.option(
                "--keep-swap", is_flag=True, help="Keep DeepSpeed's swap files after the run."
            ),
        ]
    ):
        f = opt(f)
    return f


def _run_preset(
    name: str,
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
    interval: float = 1.0,
    focus: int | None = None,
) -> None:
    from iotune.sweep.result import load_aio
    from iotune.train import runner as train_runner
    from iotune.train.render import print_estimate, print_run

    preset = _preset_with(name, sets, steps)
    aio, aio_source = load_aio(aio_config)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = (Path(out) if out else Path("results") / f"run-{preset.name}-{stamp}").resolve()
    if data:
        from iotune.train.data import FORMATS

        if not Path(data).is_file():
            raise UsageError(
                f"--data {data}: no such file", hint="name a .txt, .jsonl or .parquet file"
            )
        if Path(data).suffix.lower() not in FORMATS:
            raise UsageError(
                f"--data {data}: unknown format {Path(data).suffix or '(none)'}",
                hint="use a .txt, .jsonl or .parquet file with the text",
            )
    if tokenizer and not (Path(tokenizer) / "tokenizer_config.json").is_file():
        raise UsageError(
            f"--tokenizer {tokenizer} is not a Hugging Face tokenizer directory (no tokenizer_config.json)",
            hint="save one with AutoTokenizer.from_pretrained(...).save_pretrained(DIR), or leave it out for byte tokens",
        )
    req = train_runner.RunRequest(
        preset=preset,
        out=out_dir,
        backend=backend,
        nvme_path=Path(nvme_path) if nvme_path else None,
        aio=aio,
        aio_source=aio_source,
        data=Path(data) if data else None,
        tokenizer=Path(tokenizer) if tokenizer else None,
        force=force,
        keep_swap=keep_swap,
        quiet_stdout=STATE.json,
        interval=interval,
        focus=focus,
        progress=not STATE.json,
    )
    prep = train_runner.prepare(req)
    for note in req.notes:
        warn(note)
    if not STATE.json:
        print_estimate(err_console(), prep.preset, prep.est, prep.cfg)
        what = (
            f"{', '.join(prep.targets.disks)} ({backend})"
            if prep.targets.disks
            else "no drive (no NVMe offload)"
        )
        click.echo(
            f"iotune: running {preset.name} for {preset.steps} steps, tracing {what}; results in {out_dir}",
            err=True,
        )
    result = train_runner.run(req, prep)
    if STATE.json:
        emit_json(result)
    else:
        print_run(console(), result)
    if result["interrupted"]:
        click.echo(
            f"iotune: interrupted ({result['interrupted']}) after {result['steps_done']} step(s); "
            f"records kept in {result['out']}",
            err=True,
        )
        sys.exit(130 if result["interrupted"] == "SIGINT" else 143)
    code = result["exit_code"]
    if code:
        click.echo(
            f"iotune: the training worker failed (exit {code}) after {result['steps_done']} step(s)",
            err=True,
        )
        click.echo("hint: its output is above; rerun with --debug for iotune's own log", err=True)
        sys.exit(code if code > 0 else 128 - code)
