"""`iotune doctor`: the host's readiness checks as a table or JSON."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from iotune import doctor
from iotune.checks import Check, Family, Status
from iotune.cli.options import STATE, json_option
from iotune.errors import IotuneError
from iotune.probes.sysfs import SysTree
from iotune.render import console, emit_json

STATUS_STYLE = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red"}


def _checks_table(checks: list[Check]) -> Table:
    """One row per check: its status and what was found, with the fix under a failure."""
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("CHECK")
    table.add_column("STATUS")
    table.add_column("FOUND / FIX", overflow="fold")
    for c in checks:
        text = Text(c.found)
        if c.fix and c.status is not Status.PASS:
            text.append(f"\n  fix: {c.fix}", style="cyan")
        table.add_row(c.name, Text(c.status.value, style=STATUS_STYLE[c.status.value]), text)
    return table


@click.command("doctor")
@click.option(
    "--for",
    "family",
    type=click.Choice([f.value for f in Family]),
    help="Exit non-zero unless everything this command family needs is present.",
)
@click.option("--fix", is_flag=True, help="Apply the safe fixes (mount tracefs) before checking.")
@click.option(
    "--build-ops",
    is_flag=True,
    help="Build and load DeepSpeed's async_io op now (JIT, minutes once).",
)
@json_option
def doctor_cmd(family: str | None, fix: bool, build_ops: bool) -> None:
    """Check that this host can run iotune's commands, and say how to fix what is missing.

    Each line is PASS, WARN or FAIL with what was found and the exact fix; the last lines
    say which command families (raid, sweep, trace, train) are ready. With --for FAMILY
    the exit code is 1 when something that family needs failed.
    """
    tree = SysTree("/")
    applied = doctor.apply_fixes(tree) if fix else []
    checks = doctor.run_checks(tree, build_ops=build_ops)
    readiness = doctor.missing(checks)
    if STATE.json:
        emit_json(
            {
                "checks": checks,
                "ready": {k: not v for k, v in readiness.items()},
                "missing": readiness,
                "fixed": applied,
            }
        )
    else:
        con = console()
        for line in applied:
            con.print(f"applied: {line}")
        con.print(_checks_table(checks))
        con.print()
        for fam, missing in readiness.items():
            if missing:
                con.print(f"[bold red]not ready[/] for {fam}: {', '.join(missing)}")
            else:
                con.print(f"[green]ready[/] for {fam}")
    if family and readiness[family]:
        raise IotuneError(
            f"this host is not ready for '{family}': {', '.join(readiness[family])} failed",
            hint="each FAIL line above says how to fix it",
        )
