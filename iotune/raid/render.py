"""Screen rendering for the raid commands: a plan (each step and why), and the arrays table."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from iotune.probes.blockdev import BlockDevice
from iotune.raid.model import ArrayInfo, Plan, Step
from iotune.raid.plan import ArrayFacts
from iotune.render import human_bytes
from iotune.units import format_size


def print_steps(con: Console, steps: Sequence[Step]) -> None:
    """Numbered steps, each command line with its reason under it."""
    for i, step in enumerate(steps, 1):
        con.print(f"  {i}. {step.describe()}", soft_wrap=True)
        con.print(f"     [dim]why: {step.why}[/]")


def print_plan(con: Console, plan: Plan, disks: dict[str, BlockDevice]) -> None:
    """A create plan: the members (model, serial, size), capacity, alignment, steps, notes."""
    req = plan.request
    con.print(f"[bold]Plan:[/] RAID{req.level} {plan.device} over {len(plan.members)} drives")
    for m in plan.members:
        d = disks.get(m.removeprefix("/dev/"))
        ident = [x for x in (d.model, d.serial, human_bytes(d.size_bytes)) if x] if d else []
        con.print(f"  member {m} ({', '.join(ident)})")
    chunk = "" if req.level == 1 else f", chunk {format_size(req.chunk)}"
    con.print(
        f"  capacity ≈ {human_bytes(plan.capacity_bytes)} ({plan.data_disks} data disk(s){chunk})"
    )
    if plan.alignment:
        con.print(f"  filesystem alignment: {req.fs.value} {plan.alignment}")
    print_steps(con, plan.steps)
    for n in plan.notes:
        con.print(f"  note: {n}")


def print_destroy_plan(con: Console, facts: ArrayFacts, steps: Sequence[Step]) -> None:
    con.print(
        f"[bold]Plan:[/] destroy {facts.device} ({facts.kernel_name}, members {', '.join(facts.members)})"
    )
    print_steps(con, steps)


def arrays_table(arrays: Sequence[ArrayInfo]) -> Table:
    """One row per array: level, chunk, state (and resync progress), size, filesystem, mount
    points, the queue limits it passes down, and its members."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in (
        "ARRAY",
        "LEVEL",
        "CHUNK",
        "STATE",
        "SIZE",
        "FS",
        "MOUNT",
        "MAX KB",
        "MIN/OPT IO",
        "MEMBERS",
    ):
        table.add_column(col)
    for a in arrays:
        members = "\n".join(
            f"{m['device']} {m['model'] or ''} {m['serial'] or ''}".strip()
            + (f" [{m['state']}]" if m.get("state") not in (None, "in_sync") else "")
            for m in a.members
        )
        sync = (
            f" ({a.sync_action} {a.sync_completed})" if a.sync_action not in (None, "idle") else ""
        )
        table.add_row(
            f"{a.device} ({a.kernel_name})",
            a.level or "-",
            format_size(a.chunk_bytes) if a.chunk_bytes else "-",
            (a.state or "-") + sync + (f" (no live path: {a.lost_path})" if a.lost_path else ""),
            human_bytes(a.size_bytes),
            a.fs or "-",
            ", ".join(a.mountpoints) or "-",
            str(a.max_sectors_kb),
            f"{a.minimum_io_size}/{a.optimal_io_size}",
            members,
        )
    return table
