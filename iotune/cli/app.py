"""The `iotune` group: global options, the error-to-exit-code mapping, the entry point, and the
commands of every family registered on the group, each imported when it is used: a command
imports its own family's module only (``--help`` imports them all)."""

from __future__ import annotations

import importlib
import logging
import sys
import traceback
from typing import Any

import click

from iotune import __version__
from iotune.cli.options import STATE
from iotune.errors import IotuneError

#: each command's name and where it is defined, in the order --help lists them
COMMANDS = {
    "devices": "devices:devices_cmd",
    "doctor": "doctor:doctor_cmd",
    "fabrics": "fabrics:fabrics_group",
    "raid": "raid:raid_group",
    "sweep-aio": "sweep:sweep_aio",
    "sweep-threads": "sweep:sweep_threads",
    "sweep-checkpoint": "ckpt_sweep:sweep_checkpoint",
    "trace": "trace:trace_cmd",
    "presets": "presets:presets_group",
    "estimate": "train:estimate_cmd",
    "run": "train:run_cmd",
    "study": "study:study_cmd",
    "report": "report:report_cmd",
}


class IotuneGroup(click.Group):
    """Every failure ends as one error line and a hint; tracebacks only with --debug. The
    commands are imported as they are asked for (:data:`COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, attr = where.split(":")
        command = getattr(importlib.import_module(f"iotune.cli.{module}"), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"iotune.cli.{module}.{attr} is not a command")
        return command

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except IotuneError as exc:
            if STATE.debug:
                traceback.print_exc()
            exc.show()
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            click.echo(f"iotune: error: {exc.format_message()}", err=True)
            cmd = exc.ctx.command_path if exc.ctx else "iotune"
            click.echo(f"hint: '{cmd} --help' lists the commands and options", err=True)
            sys.exit(2)
        except click.ClickException as exc:
            click.echo(f"iotune: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("iotune: aborted", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("iotune: interrupted", err=True)
            sys.exit(130)
        except Exception as exc:  # noqa: BLE001 - last resort: one line, traceback with --debug
            if STATE.debug:
                traceback.print_exc()
            click.echo(f"iotune: internal error: {type(exc).__name__}: {exc}", err=True)
            click.echo("hint: run with --debug for the traceback, and report it", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(
    cls=IotuneGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="iotune")
@click.option(
    "--json", "json_out", is_flag=True, help="Machine-readable JSON on stdout, nothing else there."
)
@click.option("--debug", is_flag=True, help="Log every external command; show tracebacks.")
@click.option("-v", "--verbose", count=True, help="More progress detail on stderr.")
def cli(json_out: bool, debug: bool, verbose: int) -> None:
    """Measure and tune NVMe offload for DeepSpeed training.

    \b
    The loop:
      iotune doctor    is this host ready? (root, BPF, headers, mdadm, fio, libaio,
                       DeepSpeed, GPU)
      iotune devices   NVMe drives: PCIe link, NUMA node, queue limits, in use or
                       free (and why)
      iotune fabrics   connect NVMe over Fabrics namespaces (TCP, RDMA), checked
                       first; disconnect them when unused
      iotune raid      plan-then-apply mdadm RAID volumes across free NVMe drives
      iotune sweep-aio tune DeepSpeed async I/O on a volume against its fio ceiling
      iotune sweep-threads
                       CPU Adam step time over OpenMP threads (and ranks at once),
                       and the host's memory bandwidth
      iotune sweep-checkpoint
                       tune DeepSpeed's fast checkpoint writer on the checkpoint
                       volume, against torch.save and the volume's ceiling; with
                       --copy-from, the copy a save makes of NVMe-offloaded state
      iotune presets   the training experiments (1B-16B x offload strategy x
                       accumulation, and tiny CPU ones) with their estimated needs
      iotune estimate  NVMe space and bytes read/written per step, predicted
      iotune run       offloaded DeepSpeed training steps: per-step timings and
                       the study's table (space on NVMe, GB read/written, times)
      iotune trace     count every block request per drive by exact size (eBPF),
                       checked against the kernel's counters; --run PRESET traces
                       a training run
      iotune study     run a grid of presets (sizes x strategies x accumulation),
                       resumable, one record per run
      iotune report    the study's tables and figures (Markdown, HTML) from
                       studies, runs and sweeps

    Every command takes --json for scripts. Errors print one line and a hint;
    --debug shows the commands iotune runs and full tracebacks.
    """
    STATE.json = json_out
    STATE.debug = debug
    level = logging.DEBUG if debug else logging.INFO if verbose else logging.WARNING
    logging.basicConfig(level=level, format="iotune: %(name)s: %(message)s", stream=sys.stderr)


def main() -> None:
    """Console entry point (``iotune``)."""
    cli()
