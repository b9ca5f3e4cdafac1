"""Screen output: rich tables on stdout, messages on stderr, JSON for scripts."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console

from iotune.records import dumps


def console() -> Console:
    """Tables go to stdout; off a terminal (a pipe, a file) rows are never folded."""
    width = None if sys.stdout.isatty() else 1000
    return Console(width=width, highlight=False, soft_wrap=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def emit_json(obj: Any) -> None:
    click.echo(dumps(obj))


def warn(message: str) -> None:
    click.echo(f"iotune: warning: {message}", err=True)


def human_bytes(n: int | None) -> str:
    """Binary units, labelled as such (GiB, not GB)."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"
