"""`iotune report`: the study's tables and figures from what studies, runs and sweeps
recorded."""

from __future__ import annotations

import time
from pathlib import Path

import click

from iotune.cli.options import STATE, comma_list, json_option
from iotune.errors import UsageError
from iotune.render import console, emit_json

FORMATS = ("md", "html")


def _format(text: str) -> str:
    if text not in FORMATS:
        raise UsageError(f"--format: {text!r} is not md or html", hint="--format md,html")
    return text


@click.command("report")
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option(
    "--out", type=click.Path(), help="Report directory (default results/report-DATE-TIME)."
)
@click.option(
    "--format",
    "formats",
    default="md,html",
    show_default=True,
    help="md: report.md with PNG figures beside it; html: one self-contained report.html.",
)
@json_option
def report_cmd(paths: tuple[str, ...], out: str | None, formats: str) -> None:
    """The study's tables and figures from studies, runs and sweeps (any mix of their
    directories, or a directory holding several).

    \b
    iotune report results/study-20261122-101500
    iotune report results/study-1b results/sweep-aio-nvme0 results/threads-host --out report/

    \b
    Tables: per model size, one row per strategy x accumulation: step and optimizer
    seconds, NVMe space, GiB read and written per step (measured, the estimate in
    parentheses), requests of exactly the AIO block size and of any other size,
    and the study's published row beside it; predicted vs measured step time.
    Figures (PNG): step time per strategy x accumulation at each size; the
    optimizer's share of the step; NVMe bytes per step, measured vs estimated;
    request sizes per drive; each AIO sweep's bandwidth over block size x queue
    depth; CPU Adam over threads. report.html embeds them: one file to attach.
    """
    from iotune.report.document import study_threads, write
    from iotune.report.load import load

    fmts = list(comma_list(formats, _format, "--format"))
    data = load([Path(p) for p in paths])
    out_dir = (
        Path(out) if out else Path("results") / f"report-{time.strftime('%Y%m%d-%H%M%S')}"
    ).resolve()
    written = write(out_dir, data, fmts, study_threads())
    written["runs"] = len(data.runs)
    written["sweeps"] = len(data.sweeps)
    written["thread_sweeps"] = len(data.threads)
    if STATE.json:
        emit_json(written)
        return
    con = console()
    con.print(
        f"report of {len(data.runs)} run(s), {len(data.sweeps)} AIO sweep(s), "
        f"{len(data.threads)} thread sweep(s): {out_dir}"
    )
    for k in ("md", "html"):
        if k in written:
            con.print(f"  {out_dir / written[k]}")
    for f in written["figures"]:
        con.print(f"  {out_dir / f}")
