"""Screen rendering of training runs: the seed study's table, per step, per rank and per
drive, with the prediction beside the measurement (render_plan.py: before a run)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from iotune.trace.model import step_io
from iotune.trace.render import latency_line, latency_steps_table, other_io_line
from iotune.units import GIB, binary_size, gib_text


def _cell(v: Any, fmt: str = "{:,}") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    return fmt.format(v)


def run_table(result: dict[str, Any]) -> Table:
    f = binary_size(result["focus_size"])
    t = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title=f"{result['preset']} (GiB = 2^30 bytes, the study's 'GB'; requests counted at the drives)",
    )
    for col in (
        "CASE",
        "NVMe GiB",
        "READ GiB",
        "WRITE GiB",
        "STEP s",
        "OPTIMIZER s",
        f"R {f}",
        f"W {f}",
        "R OTHER",
        "W OTHER",
    ):
        t.add_column(col, justify="left" if col == "CASE" else "right")
    for r in result["table"] + result["estimate_table"]:
        t.add_row(
            r["case"],
            _cell(r["nvme_gib"]),
            _cell(r["read_gib"]),
            _cell(r["write_gib"]),
            _cell(r["step_s"]),
            _cell(r["optimizer_s"]),
            _cell(r["read_focus"]),
            _cell(r["write_focus"]),
            _cell(r["read_other"]),
            _cell(r["write_other"]),
        )
    return t


def steps_table(result: dict[str, Any]) -> Table:
    io = {s["label"]: s for s in result.get("io_steps", [])}
    t = Table(box=None, pad_edge=False, header_style="bold", title="per step")
    for col in (
        "STEP",
        "FORWARD s",
        "BACKWARD s",
        "OPTIMIZER s",
        "TOTAL s",
        "TOKENS/s",
        "LOSS",
        "PEAK GPU GiB",
        "RSS GiB",
        "READ GiB",
        "WRITE GiB",
        "SWAP GiB",
    ):
        t.add_column(col, justify="left" if col == "STEP" else "right")
    for e in result["events"]:
        label = f"{e['event']}:{e['step']}"
        s = step_io(io[label]) if label in io else None
        rd = s["read"]["bytes"] / GIB if s else None
        wr = s["write"]["bytes"] / GIB if s else None
        if e["event"] == "init":
            t.add_row(
                "init",
                "-",
                "-",
                "-",
                _cell(e.get("init_s")),
                "-",
                "-",
                "-",
                "-",
                _cell(rd),
                _cell(wr),
                _cell(e["swap"]["allocated"] / GIB),
            )
            continue
        if e["event"] == "checkpoint":
            t.add_row(f"save {e['tag']}", *"-----", "-", "-", "-", _cell(rd), _cell(wr), "-")
            continue
        if e["event"] == "persist":  # the wait for a save's persist (--checkpoint-persist)
            t.add_row(
                f"persist {e['tag']}",
                *"---",
                _cell(e.get("waited_s")),
                *"----",
                _cell(rd),
                _cell(wr),
                "-",
            )
            continue
        t.add_row(
            str(e["step"])
            if e.get("global_step", e["step"]) == e["step"]
            else f"{e['step']} ({e['global_step']})",
            _cell(e["forward_s"]),
            _cell(e["backward_s"]),
            _cell(e["optimizer_s"]),
            _cell(e["step_s"]),
            _cell(e["tokens_per_s"]),
            _cell(e["loss"]),
            gib_text(e.get("peak_accel_bytes")),
            gib_text(e.get("host_rss_peak_bytes")),
            _cell(rd),
            _cell(wr),
            _cell(e["swap"]["allocated"] / GIB),
        )
    return t


def _vs(pred: float | None, meas: float | None) -> str:
    if pred is None:
        return "-"
    if meas:
        return f"{pred:.2f} s predicted, {meas:.2f} s measured ({pred / meas - 1:+.0%})"
    return f"{pred:.2f} s predicted"


def print_prediction(con: Console, pred: dict[str, Any]) -> None:
    """Predicted optimizer and step time, its terms, and the measurement where there is one."""
    meas = pred.get("measured") or {}
    if pred.get("optimizer_s") is None:
        why = "; ".join(pred.get("notes") or []) or "nothing to predict from"
        con.print(f"step-time prediction: none ({why})", soft_wrap=True)
        return
    con.print(
        f"optimizer step: {_vs(pred['optimizer_s'], meas.get('optimizer_s'))}", soft_wrap=True
    )
    if pred.get("step_s") is not None:
        con.print(f"whole step: {_vs(pred['step_s'], meas.get('step_s'))}", soft_wrap=True)
    con.print(
        "  from: " + "; ".join(f"{t['what']} {t['seconds']:.2f} s" for t in pred["terms"]),
        soft_wrap=True,
    )
    for n in pred.get("notes") or []:
        con.print(f"  note: {n}", soft_wrap=True)


def ranks_table(result: dict[str, Any]) -> Table | None:
    """Each rank's steady step, memory and swap files: a multi-rank run only."""
    rows = result.get("per_rank") or []
    if len(rows) < 2:
        return None
    ram = result.get("host_ram") or {}
    est = ram.get("estimate_peak_per_rank")
    t = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title=f"per rank ({result.get('world', len(rows))} in all; the step waits for the slowest)",
    )
    for col in (
        "RANK",
        "NODE",
        "STEP s",
        "OPTIMIZER s",
        "READ GiB",
        "WRITE GiB",
        "PEAK RSS GiB",
        "PEAK GPU GiB",
        "SWAP GiB",
        "SWAP DIR",
    ):
        t.add_column(col, justify="left" if col in ("NODE", "SWAP DIR") else "right")
    for r in rows:
        gpu = r.get("peak_accel_bytes")
        t.add_row(
            str(r["rank"]),
            str(r.get("node") or "-"),
            _cell(r["step_s"]),
            _cell(r["optimizer_s"]),
            gib_text(r.get("read_bytes_per_step"), 3),
            gib_text(r.get("write_bytes_per_step"), 3),
            f"{r['host_rss_peak_bytes'] / GIB:.2f}",
            f"{gpu / GIB:.2f}" if gpu else "-",
            f"{r['swap_allocated'] / GIB:.3f}",
            str(r.get("swap_dir") or "-"),
        )
    if est:
        t.caption = (
            f"READ/WRITE: each rank's own storage I/O per steady step (/proc/PID/io); "
            f"estimated peak RSS per rank: {est / GIB:.2f} GiB"
        )
    return t


def drives_table(result: dict[str, Any]) -> Table | None:
    """Bytes per steady step and rate over the step, per drive: several drives only."""
    rows = result.get("per_drive") or []
    if len(rows) < 2:
        return None
    t = Table(box=None, pad_edge=False, header_style="bold", title="per drive, steady step")
    for col in ("DRIVE", "READ GiB", "WRITE GiB", "READ GiB/s", "WRITE GiB/s"):
        t.add_column(col, justify="left" if col == "DRIVE" else "right")
    for r in rows:
        t.add_row(
            r["drive"],
            f"{r['read_bytes'] / GIB:.3f}",
            f"{r['write_bytes'] / GIB:.3f}",
            _cell(r["read_gib_s"]),
            _cell(r["write_gib_s"]),
        )
    return t


def checkpoints_table(result: dict[str, Any]) -> Table | None:
    """Each save: the seconds the step was blocked and until durable, what it left on disk,
    what it read from the offload volume and wrote to the checkpoint volume, beside the I/O
    model's bytes."""
    ck = result.get("checkpoints")
    if not ck:
        return None
    t = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title=f"checkpoints ({ck['writer']} writer, {ck.get('copy') or 'deepspeed'} copy)",
    )
    for col in (
        "SAVE",
        "BLOCKED s",
        "DURABLE s",
        "FILES",
        "ON DISK GiB",
        "READ OFFLOAD GiB",
        "WRITE CHECKPOINT GiB",
        "WRITE GiB/s",
    ):
        t.add_column(col, justify="left" if col == "SAVE" else "right")
    for r in ck["saves"]:
        t.add_row(
            str(r["tag"]),
            _cell(r["blocked_s"]),
            _cell(r["durable_s"]),
            _cell(r["files"]),
            gib_text(r["bytes"], 3),
            gib_text(r["offload_read_bytes"], 3),
            gib_text(r["checkpoint_write_bytes"], 3),
            _cell(r["write_gib_s"]),
        )
    m = ck["estimate"]
    t.add_row(
        "estimate" if m["exact"] else "estimate (about)",
        "-",
        "-",
        "-",
        gib_text(m.get("bytes", m["write_bytes"]), 3),
        gib_text(m["read_bytes"], 3),
        gib_text(m["write_bytes"], 3),
        "-",
    )
    return t


def parity_lines(result: dict[str, Any]) -> list[str]:
    """Each save on a protected array, and each save's persist on one (--checkpoint-persist):
    the members' writes against the copy's and the full-stripe ideal, what they read back,
    and the advice on the chunk."""
    out = []
    for r in (result.get("checkpoints") or {}).get("saves", []):
        if r.get("parity"):
            out += _parity_lines(r["tag"], "save", r["parity"])
        persisted = (r.get("persist") or {}).get("parity")
        if persisted:
            out += _parity_lines(f"{r['tag']} persisted", "persist", persisted)
    return out


def _parity_lines(head: str, what: str, p: dict[str, Any]) -> list[str]:
    chunk = f", chunk {p['chunk_bytes'] // 1024} KiB" if p.get("chunk_bytes") else ""
    out = [
        f"{head}: {p['level']} of {p['members']}{chunk}: the members wrote "
        f"{p['member_write_bytes'] / GIB:.3f} GiB for the {what}'s {p['saved_bytes'] / GIB:.3f} GiB, "
        f"{p['amplification']:.3f}x (full stripes: {p['ideal']:.3f}x), and read "
        f"{p['member_read_bytes'] / 2**20:.1f} MiB back"
        + (" (read-modify-write)" if p["read_modify_write"] else "")
    ]
    if p.get("array_amplification"):
        out.append(
            f"  the array was asked to write {p['array_write_bytes'] / GIB:.3f} GiB (the "
            f"files, the file system's log and metadata): the members wrote "
            f"{p['array_amplification']:.3f}x that (full stripes {p['ideal']:.3f}x, page "
            f"by page {p['partial_worst']:.3f}x)"
        )
    out += [f"  {line}" for line in member_sizes(p)]
    if p.get("advice"):
        out.append(f"advice: {p['advice']}")
    return out


def persist_lines(result: dict[str, Any]) -> list[str]:
    """Each save persisted (--checkpoint-persist): what its copy wrote there, how long after
    the save it was durable with its latest, how long the next save (or the run's end) waited
    for it; and the steps that ran beside a copy, whose reads of the offload volume hold the
    copy's reads of the snapshot."""
    saves = (result.get("checkpoints") or {}).get("saves", [])
    out = []
    for r in saves:
        p = r.get("persist")
        if p:
            out.append(
                f"{r['tag']}: persisted into {p['dir']}: {p['bytes'] / GIB:.3f} GiB in "
                f"{p['files']} files by the aio copy, durable with its latest {p['seconds']:.2f} s "
                f"after the save; waited for {p['waited_s']:.2f} s"
                + (
                    f"; the persist volume's drives wrote {p['write_bytes'] / GIB:.3f} GiB for it"
                    if p.get("write_bytes") is not None
                    else ""
                )
            )
    beside = [str(e["step"]) for e in result.get("events", []) if e.get("persist_beside")]
    if beside:
        out.append(
            f"step(s) {', '.join(beside)} ran beside a persist: their reads of the offload "
            "volume include the copy's reads of the snapshot"
            + (
                "; its writes to the persist volume are the persist's, not theirs"
                if any("primary" in s for s in result.get("io_steps", []))
                else ", and their writes its writes to the persist volume (on the same drives)"
            )
        )
    return out


def member_sizes(p: dict[str, Any], top: int = 3) -> list[str]:
    """Each member's writes of a save by exact request size: the sizes that carried the most
    bytes, with their counts, and how many other sizes there were."""
    out = []
    for name, m in p["per_member"].items():
        sizes = {int(k): int(v) for k, v in (m.get("sizes") or {}).items()}
        ranked = sorted(sizes.items(), key=lambda kv: (-kv[0] * kv[1], kv[0]))
        shown = ", ".join(f"{binary_size(size)} x{n:,}" for size, n in ranked[:top])
        rest = f" and {len(ranked) - top} other size(s)" if len(ranked) > top else ""
        out.append(
            f"{name}: wrote {m['write'] / 2**20:.1f} MiB in {sum(sizes.values()):,} requests"
            + (f" ({shown}{rest})" if shown else "")
            + f", read {m['read'] / 2**20:.1f} MiB"
        )
    return out


def print_run(con: Console, result: dict[str, Any]) -> None:
    con.print(steps_table(result))
    con.print()
    if result.get("resumed_at"):
        con.print(f"resumed from the checkpoint of step {result['resumed_at']}")
    for extra in (ranks_table(result), drives_table(result), checkpoints_table(result)):
        if extra is not None:
            con.print(extra)
            con.print()
    for text in [*parity_lines(result), *persist_lines(result)]:
        con.print(text, soft_wrap=True)
    lat = latency_steps_table(result.get("io_steps") or [])
    if lat is not None:
        con.print(lat)
        for name, per in (result.get("latency") or {}).items():
            line = latency_line(name, per)
            if line:
                con.print(line, soft_wrap=True)
        con.print()
    con.print(run_table(result))
    fp = result.get("footprint")
    if fp and fp["estimate"]:
        con.print(
            f"space on NVMe: {fp['allocated'] / GIB:.3f} GiB measured (swap files), "
            f"{fp['estimate'] / GIB:.3f} GiB estimated ({fp['allocated'] / fp['estimate']:.3f}x)"
        )
    ram = result.get("host_ram") or {}
    if ram.get("measured_peak"):
        con.print(
            f"host RAM: peak RSS {ram['measured_peak'] / GIB:.1f} GiB measured, "
            f"{ram['estimate_peak'] / GIB:.1f} GiB estimated ({ram['ratio']:.2f}x)"
            + (
                f"; the process alone {ram['measured_process'] / GIB:.1f} GiB"
                if ram.get("measured_process")
                else ""
            )
            + (
                "; the worker was forked from a zygote: its RSS leaves out the imported pages it "
                "has not touched"
                if ram.get("forked")
                else ""
            )
        )
    for c in result.get("diskstats_check", []):
        con.print(f"{c['device']}: traced vs /sys/block/{c['device']}/stat: {c['summary']}")
    line = other_io_line(result)
    if line:
        con.print(f"note: {line}")
    st = result.get("study")
    if st:
        con.print(
            f"the study's '{st['case']}' (its N = {st['params']:.4g}; this run's {result['params']:.4g}): "
            f"space {st['space_gib']} GiB, read {st['read_gib']} GiB, write {st['write_gib']} GiB, "
            f"step {st['step_s']} s, optimizer {st['optimizer_s']} s, "
            f"R/W {binary_size(result['focus_size'])} {st['read_focus']}/{st['write_focus']}, "
            f"other {st['read_other']}/{st['write_other']}"
        )
    pred = result.get("prediction")
    if pred and (pred.get("bandwidth") or pred.get("adam")):
        print_prediction(con, pred)
    elif pred is not None and result.get("steps_done"):
        con.print(
            "step-time prediction: pass --aio-config SWEEP_RUN (iotune sweep-aio on this drive) "
            "and --threads-config THREADS_RUN (iotune sweep-threads)",
            soft_wrap=True,
        )
    for n in result.get("notes", []):
        con.print(f"note: {n}")
    con.print(f"results: {result['out']}")
