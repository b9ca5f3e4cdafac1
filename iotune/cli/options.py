"""Pieces the commands share: the --json flag and the output state it sets, option-value
parsers, the options of a training run, and the exit status of a finished workload."""

from __future__ import annotations

import shlex
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from iotune.errors import IotuneError, UsageError
from iotune.probes.fabrics import DOWN_HINT
from iotune.train.launch import LAUNCHERS


@dataclass
class State:
    """Set by the global options (and a command's own --json) before the command runs."""

    json: bool = False
    debug: bool = False


STATE = State()

T = TypeVar("T")


def json_option(f: Any) -> Any:
    """--json on a command, as after `iotune`: one JSON document on stdout."""

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


def comma_list(text: str, parse: Callable[[str], T], what: str) -> tuple[T, ...]:
    """A comma-separated option value, each item parsed, duplicates dropped, order kept."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UsageError(f"{what}: give at least one value", hint=f"e.g. {what} 1,2,4")
    return tuple(dict.fromkeys(parse(t) for t in items))


def parse_bool(text: str) -> bool:
    """true/false, 1/0, yes/no, on/off."""
    low = text.lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise UsageError(f"{text!r} is not true or false", hint="e.g. --single-submit false,true")


def positive_int(what: str) -> Callable[[str], int]:
    """A parser of positive whole numbers for the option *what*."""

    def parse(text: str) -> int:
        if not text.isdigit() or int(text) <= 0:
            raise UsageError(
                f"{what}: {text!r} is not a positive whole number", hint=f"e.g. {what} 4,8,16"
            )
        return int(text)

    return parse


#: your model and DeepSpeed config instead of a preset (estimate, run, trace)
MODEL_OPTIONS = [
    click.option(
        "--model",
        type=click.Path(),
        help="Your model instead of a preset: a Hugging Face model folder (its config.json "
        "is enough; nothing is downloaded), with --ds-config.",
    ),
    click.option(
        "--ds-config",
        type=click.Path(),
        help="Your DeepSpeed config (JSON) for --model, run as it is: iotune sets only the "
        "batch, the dtype and its own swap folder under the offload path.",
    ),
    click.option(
        "--micro-batch",
        type=click.IntRange(1, 1 << 20),
        help="With --model: sequences per micro-step (default: the config's, else 1).",
    ),
    click.option(
        "--seq-len",
        type=click.IntRange(1, 1 << 24),
        help="With --model: tokens per sequence (default 2048, or the model's maximum).",
    ),
    click.option(
        "--ga",
        type=click.IntRange(1, 1 << 20),
        help="With --model: gradient accumulation steps (default: the config's, else 1).",
    ),
]


def model_options(f: Any) -> Any:
    for opt in reversed(MODEL_OPTIONS):
        f = opt(f)
    return f


def run_options(f: Any) -> Any:
    """The options of a training run, shared by `iotune run` and `iotune trace --run`."""
    for opt in reversed(
        [
            *MODEL_OPTIONS,
            click.option(
                "--nvme-path",
                help="Offload directory (default: the preset's); with --ranks, DIR1,DIR2,... "
                "gives each rank one: on its GPU's NUMA node where known, else rank r the "
                "directory r mod their number.",
            ),
            click.option(
                "--ranks",
                type=click.IntRange(1, 1024),
                help="Data-parallel ranks on this node through DeepSpeed's launcher: one per "
                "GPU, or processes with gloo on a CPU host (default 1).",
            ),
            click.option(
                "--hostfile",
                type=click.Path(),
                help="Several nodes: DeepSpeed's hostfile (HOST slots=N per line), passed to "
                "its multi-node runner. Over pdsh (the default) every node traces its own "
                "drives and the run gathers a row per node.",
            ),
            click.option(
                "--node-rank",
                type=click.IntRange(0, 100000),
                help="With --hostfile: this node's line (from 0); run the same command on every "
                "node, no ssh (DeepSpeed's --no_ssh). Each node traces its own drives.",
            ),
            click.option(
                "--master-addr",
                help="With --hostfile: the address of the hostfile's first node, the ranks' "
                "rendezvous (default: its name).",
            ),
            click.option(
                "--launcher",
                type=click.Choice(LAUNCHERS),
                help="With --hostfile and no --node-rank: how DeepSpeed starts the other nodes "
                "(default pdsh, over ssh).",
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
                "--threads-config",
                type=click.Path(),
                help="A sweep-threads run: CPU Adam's measured time, for the step-time prediction.",
            ),
            click.option(
                "--baseline",
                type=click.Path(),
                help="A run of the same size and accumulation (e.g. opt_ram) whose forward + "
                "backward the step-time prediction uses.",
            ),
            click.option(
                "--force",
                is_flag=True,
                help="Run even when the preflight estimate says it will not fit.",
            ),
            click.option(
                "--keep-swap", is_flag=True, help="Keep DeepSpeed's swap files after the run."
            ),
            click.option(
                "--checkpoint-every",
                type=click.IntRange(1, 100000),
                metavar="STEPS",
                help="Save a checkpoint (DeepSpeed's save_checkpoint) after every STEPS steps, "
                "timed and traced apart from the steps.",
            ),
            click.option(
                "--checkpoint-dir",
                type=click.Path(),
                help="Where the checkpoints go: a volume of their own (a RAID5/6); the offload "
                "volume only with --force, or with --checkpoint-copy reflink (a snapshot on it).",
            ),
            click.option(
                "--checkpoint-writer",
                type=click.Choice(["torch", "fast", "decoupled"]),
                help="DeepSpeed's checkpoint writer: torch.save, FastPersist, or FastPersist in "
                "a process of its own (decoupled). Default: the config's checkpoint.writer, "
                "else torch.",
            ),
            click.option(
                "--checkpoint-copy",
                type=click.Choice(["aio", "reflink", "deepspeed"]),
                default="deepspeed",
                show_default=True,
                help="How a save copies the swap files of an optimizer on NVMe into the "
                "checkpoint, and a resume back: O_DIRECT through DeepSpeed's async I/O op "
                "(aio), a clone of each file where both are on one file system that clones "
                "(reflink: XFS, btrfs), or DeepSpeed's shutil.copytree (deepspeed).",
            ),
            click.option(
                "--checkpoint-persist",
                type=click.Path(),
                metavar="DIR",
                help="With --checkpoint-copy reflink: each save is a snapshot in "
                "--checkpoint-dir on the offload volume, copied in the background into DIR (a "
                "volume of its own, a RAID5/6) by the aio copy while training goes on; the next "
                "save, and the run's end, wait for it. Resume with --resume-from DIR.",
            ),
            click.option(
                "--resume-from",
                type=click.Path(),
                help="Start from a checkpoint of this model (a --checkpoint-dir); the steps and "
                "their losses go on from its step.",
            ),
        ]
    ):
        f = opt(f)
    return f


def interrupted_exit(signal_name: str) -> int:
    """The exit status after SIGINT or SIGTERM stopped a run: 128 + the signal's number."""
    return 130 if signal_name == "SIGINT" else 143


def workload_exit(code: int) -> int:
    """A workload's exit status passed on; killed by signal N (-N) it is 128 + N, as in a shell."""
    return code if code > 0 else 128 - code


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def workload_failed(command: Sequence[str], code: int, steps: int | None) -> tuple[str, str]:
    """The line and hint for a traced command that exited non-zero. `steps` is how many
    optimizer steps a script was traced through (None: not a script). After its steps, a
    DeepSpeed script can die in Python's shutdown: an async I/O thread that frees a finished
    request's buffer then must take the GIL, and the interpreter's finalisation aborts it
    (libstdc++'s "terminate called without an active exception"), a race in DeepSpeed."""
    name = Path(command[0]).name
    if steps is None:
        when = ""
    elif steps:
        when = f" after {steps} step{'s' * (steps != 1)}"
    else:
        when = " before its first step"
    how = f"exited {code}" if code > 0 else f"was killed by {_signal_name(-code)}"
    line = f"iotune: {name} {how}{when}; the trace above is what ran until then"
    hint = f"hint: its own output is above ({shlex.join(command)})"
    if steps:
        hint += (
            f"; the {steps} traced step{'s are' if steps != 1 else ' is'} whole. A DeepSpeed"
            " script can abort (SIGABRT, 'terminate called without an active exception') as"
            " Python shuts down after its last step: its async I/O threads may free their last"
            " buffers then"
        )
    return line, hint


def confirm(yes: bool, what: str) -> None:
    """Go on only when --yes was given or the user says yes."""
    if yes:
        return
    try:
        ok = click.confirm(f"{what}?", default=False, err=True)
    except click.Abort:
        ok = False
    if not ok:
        raise IotuneError("not confirmed: nothing was changed", hint="--yes applies without asking")


def exit_if_path_lost(result: dict[str, Any]) -> None:
    """A workload stopped because a fabrics namespace it used lost its path: one line naming
    it, exit 1 (the records up to then are kept)."""
    lost = result.get("lost_path")
    if lost:
        left = result.get("swap_dirs") or []  # a training run's: its file system waits too
        raise IotuneError(
            f"stopped: {lost}; records kept in {result['out']}",
            hint=f"{DOWN_HINT}; its queued I/O waits for the controller's ctrl_loss_tmo"
            + (f"; the swap files are left in {', '.join(left)}" if left else ""),
        )
