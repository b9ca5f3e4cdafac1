"""Screen rendering of a trace result: the seed study's columns, sizes, histograms, check."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from iotune.render import warn
from iotune.trace.backend import traces_requests
from iotune.units import GIB, format_size

BAR = 40


def _n(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def _seed_cells(r: dict[str, Any], w: dict[str, Any]) -> list[str]:
    """The seed study's columns: GiB read (its "GB" are GiB), GiB written, R/W at the focus
    size, R/W other."""
    return [
        f"{r['bytes'] / GIB:.3f}",
        f"{w['bytes'] / GIB:.3f}",
        _n(r["focus_requests"]),
        _n(w["focus_requests"]),
        _n(r["other_requests"]),
        _n(w["other_requests"]),
    ]


def _seed_columns(result: dict[str, Any]) -> tuple[str, ...]:
    """The headers of :func:`_seed_cells`: GiB, then requests at the focus size and other."""
    f = format_size(result["focus_size"])
    return ("READ GiB", "WRITE GiB", f"R {f}", f"W {f}", "R OTHER", "W OTHER")


def summary_table(result: dict[str, Any]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("DEVICE", *_seed_columns(result), "MAX KB", "CHUNK", "DISKSTATS CHECK"):
        table.add_column(col, justify="left" if col in ("DEVICE", "DISKSTATS CHECK") else "right")
    for d in result["devices"]:
        r, w = d["read"], d["write"]
        chk = d.get("check")
        table.add_row(
            d["name"] + (" (md/dm)" if d.get("stacked") else ""),
            *_seed_cells(r, w),
            _n(d.get("max_sectors_kb")),
            format_size(d["chunk_bytes"]) if d.get("chunk_bytes") else "-",
            chk["summary"] if chk else "diskstats only",
        )
    for a in result["arrays"]:
        r, w = a["read"], a["write"]
        table.add_row(
            f"{a['name']} = {' + '.join(a['members'])}",
            *_seed_cells(r, w),
            "-",
            format_size(a["chunk_bytes"]) if a.get("chunk_bytes") else "-",
            f"{a.get('level') or 'md'}: sum over members",
        )
    return table


def print_details(con: Console, result: dict[str, Any], top: int = 5) -> None:
    for d in result["devices"]:
        if not traces_requests(result["backend"]):
            continue
        line = latency_line(d["name"], d.get("latency"))
        if line:
            con.print(line)
        for op in ("read", "write", "discard", "flush"):
            sizes = d[op]["sizes"]
            if not sizes:
                continue
            ranked = sorted(((int(k), v) for k, v in sizes.items()), key=lambda kv: (-kv[1], kv[0]))
            shown = ", ".join(f"{format_size(k)} x{v:,}" for k, v in ranked[:top])
            more = f" (+{len(ranked) - top} more sizes)" if len(ranked) > top else ""
            con.print(f"{d['name']} {op}: {d[op]['requests']:,} requests; top sizes: {shown}{more}")
            hist = d.get("histogram", {}).get(op, [])
            peak = max((n for _, _, n in hist), default=0)
            for lo, hi, n in hist:
                bar = "*" * max(1, round(BAR * n / peak)) if peak else ""
                con.print(
                    f"  {format_size(lo):>6} -> {format_size(hi + 1) if hi else '0':<6} {n:>10,} |{bar:<{BAR}}|"
                )


def _us(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.1f} µs"


def latency_line(name: str, lat: dict[str, Any] | None) -> str | None:
    """A drive's latency and depth in one line (None: nothing timed)."""
    if not lat:
        return None
    parts = []
    for op in ("read", "write"):
        st = lat.get(op)
        if st:
            parts.append(
                f"{op} p50 {_us(st['p50_us'])}, p99 {_us(st['p99_us'])}, "
                f"p99.9 {_us(st['p99_9_us'])}, max {_us(st['max_us'])} ({st['requests']:,})"
            )
    for op, st in (lat.get("queued") or {}).items():
        if st:
            parts.append(f"queued before the driver ({op}) p50 {_us(st['p50_us'])}")
    depth = lat["depth"]
    issue = depth.get("at_issue")
    if not parts and not issue:
        return None
    if depth.get("mean") is not None:
        parts.append(f"in flight {depth['mean']:.2f} (time-weighted mean)")
    if issue:
        parts.append(f"at issue p50 {issue['p50']}, p99 {issue['p99']}, max {issue['max']}")
    return f"{name} latency: " + "; ".join(parts)


def latency_steps_table(steps: list[dict[str, Any]]) -> Table | None:
    """Per step and drive: read and write p50/p99 and the time-weighted in-flight depth
    (None where no step has them)."""
    rows = []
    for s in steps:
        for name, per in (s.get("drives") or {}).items():
            lat = per.get("latency")
            if not lat or not lat["depth"].get("timed"):
                continue
            cells = [s["label"], name]
            for op in ("read", "write"):
                st = lat.get(op) or {}
                cells += [_us(st.get("p50_us")), _us(st.get("p99_us"))]
            mean = lat["depth"].get("mean")
            cells.append("-" if mean is None else f"{mean:.2f}")
            rows.append(cells)
    if not rows:
        return None
    table = Table(box=None, pad_edge=False, header_style="bold", title="latency per step")
    for col in ("STEP", "DRIVE", "READ p50", "READ p99", "WRITE p50", "WRITE p99", "IN FLIGHT"):
        table.add_column(col, justify="left" if col in ("STEP", "DRIVE") else "right")
    for cells in rows:
        table.add_row(*cells)
    return table


def print_steps(con: Console, result: dict[str, Any]) -> None:
    steps = result.get("steps") or []
    if not steps:
        return
    table = Table(
        box=None, pad_edge=False, header_style="bold", title="per step (all traced drives)"
    )
    for col in ("STEP", "SECONDS", *_seed_columns(result)):
        table.add_column(col, justify="left" if col == "STEP" else "right")
    for s in steps:
        table.add_row(
            s["label"],
            f"{s['t_end'] - s['t_start']:.2f}",
            *_seed_cells(s["read"], s["write"]),
        )
    con.print(table)
    lat = latency_steps_table(steps)
    if lat is not None:
        con.print(lat)


def _binary(n: int) -> str:
    return f"{n / 2**10:.0f} KiB" if n < 2**20 else f"{n / 2**20:.1f} MiB"


def other_io_line(result: dict[str, Any], top: int = 4) -> str | None:
    """One line naming I/O on the traced drives that the workload did not submit (writeback,
    journal, other processes): counted in the drives' figures, but not the workload's; under
    a filter (--cgroup with a COMMAND), not the cgroup's and left out of the figures."""
    other = result.get("other_io")
    if not other or not other["others"]:
        return None
    tot = other["other_bytes"]
    who = ", ".join(
        f"{r['comm']} (pid {r['pid']}, {r['device']}) {_binary(r['read'] + r['write'])}"
        for r in other["others"][:top]
    )
    more = len(other["others"]) - top
    only = result.get("only")
    whose = "not the workload's but in the figures above"
    if only:
        owner = f"cgroup {only['cgroup']}" if "cgroup" in only else f"pid {only['pid']}"
        whose = f"not {owner}'s and not in the figures above"
    return (
        f"other I/O on the traced drive(s), {whose}: "
        f"{_binary(tot['read'])} read, {_binary(tot['write'])} written by {who}"
        + (f" and {more} more" if more > 0 else "")
    )


def print_trace(con: Console, result: dict[str, Any]) -> None:
    """A trace's whole report: the table, sizes and histograms, steps, and where it is kept."""
    con.print(summary_table(result))
    con.print()
    print_details(con, result)
    print_steps(con, result)
    line = other_io_line(result)
    if line:
        con.print(f"note: {line}")
    if any(result["dropped"].values()):
        warn(f"BPF maps were full: {result['dropped']} requests not counted")
    con.print(f"results: {result['out']}")
