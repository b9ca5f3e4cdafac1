"""Screen rendering for `iotune sweep-checkpoint`: every save, torch.save, the ceiling, the
best and why."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from iotune.sweep.ckpt import knobs_of
from iotune.units import GIB, amount, binary_size


def _cell(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def points_table(result: dict[str, Any]) -> Table:
    ceil = (result.get("ceiling") or {}).get("bw_bytes_s")
    t = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title=f"fast writer saves of {result['state_bytes'] / GIB:.2f} GiB "
        "(GiB = 2^30 bytes; durable = after the writer's fsync; "
        "COPY: the writer's copy of each record before its buffer's)",
        title_justify="left",
    )
    for col in (
        "STAGE",
        "CRC32",
        "COPY",
        "BUFFER",
        "BLOCK",
        "QD",
        "THREADS",
        "DURABLE s",
        "GiB/s",
        "OF CEILING",
        "COPY s",
        "FILL s",
        "WAIT s",
        "",
    ):
        t.add_column(col, justify="left" if col in ("STAGE", "BUFFER", "") else "right")
    best = result.get("best")
    for r in result["points"]:
        k = knobs_of(r)
        ok = r.get("status") == "ok"
        rate = r["bytes"] / r["durable_s"] if ok else None
        t.add_row(
            r["stage"] + (f" ({r['round']})" if r.get("round", 1) > 1 else ""),
            "on" if k.crc32 else "off",
            "on" if k.record_copy else "off",
            f"{binary_size(k.io_buffer_size)} {'x2' if k.io_buffer_double else 'x1'}",
            binary_size(k.block_size),
            str(k.queue_depth),
            str(k.threads),
            _cell(r.get("durable_s")) if ok else r.get("status", "?"),
            _cell(rate / GIB if rate else None),
            _cell(100 * rate / ceil if rate and ceil else None, "{:.0f}%"),
            _cell(r.get("copy_s")),
            _cell(r.get("fill_s")),
            _cell(r.get("aio_write_s")),
            "best" if best is not None and r["key"] == best["key"] else "",
        )
    return t


def print_result(con: Console, result: dict[str, Any]) -> None:
    con.print(points_table(result))
    ceil = result.get("ceiling")
    if ceil and ceil.get("bw_bytes_s"):
        con.print(
            f"  the volume's write ceiling: {amount(ceil['bw_bytes_s'], '/s')} ({ceil.get('source')})"
        )
    torch_rec = result.get("torch")
    if torch_rec and torch_rec.get("status") == "ok":
        con.print(
            f"  torch.save: {torch_rec['bytes'] / GIB:.2f} GiB, returned after "
            f"{torch_rec['blocked_s']:.2f} s, durable after {torch_rec['durable_s']:.2f} s"
        )
    for line in result["why"]:
        con.print(f"  {line}", soft_wrap=True)
    best = result.get("best")
    if best is not None:
        k = knobs_of(best)
        con.print(
            f"[bold]best:[/] {k.label()}: durable after {best['durable_s']:.2f} s", soft_wrap=True
        )
        goal = result["goal"]
        if goal["share_of_ceiling"] is not None:
            verdict = "met" if goal["met"] else "not met"
            con.print(
                f"  goal ({100 * goal['share_target']:.0f}% of the ceiling and durable before "
                f"torch.save): {verdict}, {100 * goal['share_of_ceiling']:.0f}% of the ceiling",
                soft_wrap=True,
            )
    if result.get("script"):
        con.print(f"  and {result['script']}", soft_wrap=True)
    written = result.get("written")
    if written:
        con.print(f"  wrote the writer into {written['path']}")
        if written.get("note"):
            con.print(f"  note: {written['note']}", soft_wrap=True)
    if result.get("interrupted"):
        con.print(f"  interrupted: the saves so far are kept; --resume {result['out']} goes on")
