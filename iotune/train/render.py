"""Screen rendering for presets, estimates and training runs (the seed study's table)."""

from __future__ import annotations

import copy
from typing import Any

from rich.console import Console
from rich.table import Table

from iotune.trace.render import other_io_line
from iotune.train.dsconfig import model_element_size, study_differences
from iotune.train.estimate import Estimate, IoVolume, estimate, per_n
from iotune.train.presets import Preset, resolve_dtype
from iotune.train.study import StudyRow, study_row
from iotune.units import GIB, binary_size, format_size, scale_for


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.1f}"


def _gib3(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.3f}"


def _b(n: int) -> str:
    """Parameter counts: 1.24B, 28.97M."""
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def presets_json(rows: list[tuple[Preset, Estimate]]) -> list[dict[str, Any]]:
    """`iotune presets list --json`: one object per preset with its estimated needs."""
    return [
        {
            "name": p.name,
            "size": p.size,
            "strategy": p.strategy.name,
            "params": e.params,
            "geometry": p.geometry.llama_config(),
            "ga": p.ga,
            "seq_len": p.seq_len,
            "accelerator": p.accelerator,
            "nvme_bytes": e.nvme_bytes,
            "gpu_bytes": e.gpu_bytes,
            "host_bytes": e.host_bytes,
        }
        for p, e in rows
    ]


def presets_table(rows: list[tuple[Preset, Estimate]]) -> Table:
    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in (
        "PRESET",
        "PARAMS",
        "GEOMETRY",
        "STRATEGY",
        "GA",
        "SEQ",
        "DEVICE",
        "NVMe GiB",
        "GPU GiB",
        "RAM GiB",
    ):
        t.add_column(
            col,
            justify="right"
            if col in ("PARAMS", "GA", "SEQ", "NVMe GiB", "GPU GiB", "RAM GiB")
            else "left",
        )
    for p, e in rows:
        t.add_row(
            p.name,
            _b(e.params),
            p.geometry.describe(),
            p.strategy.name,
            str(p.ga),
            str(p.seq_len),
            p.accelerator,
            _gib(e.nvme_bytes) if e.nvme_bytes else "-",
            _gib(e.gpu_bytes),
            _gib(e.host_bytes),
        )
    return t


def print_estimate(con: Console, p: Preset, e: Estimate, cfg: dict[str, Any]) -> None:
    def say(text: str) -> None:
        con.print(text, soft_wrap=True)  # long lines stay whole on a narrow or piped stderr

    n = e.params
    sw = e.swapped
    dt = "bf16" if model_element_size(cfg) == 2 else "fp32"
    say(f"[bold]{p.name}[/]: {p.strategy.about}")
    say(
        f"  model     Llama {p.geometry.describe()}: N = {n:,} parameters ({_b(n)}), "
        f"micro-batch {p.micro_batch} x {p.seq_len} tokens, accumulation {p.ga}, "
        f"{'gradient checkpointing, ' if p.gradient_checkpointing else ''}{dt}, Adam, {p.accelerator}"
    )
    if p.accelerator == "cpu":
        say(f"  dtype     {dt}: {resolve_dtype(p).why}")
    zo = cfg["zero_optimization"]
    where = {
        "optimizer": zo.get("offload_optimizer", {}).get("device", "accelerator"),
        "parameters": zo.get("offload_param", {}).get("device", "accelerator"),
    }
    say(
        f"  deepspeed ZeRO stage {zo['stage']}, optimizer state on {where['optimizer']}, "
        f"parameters on {where['parameters']}"
        + (f", aio block {format_size(cfg['aio']['block_size'])}" if "aio" in cfg else "")
    )
    if sw.n_s or sw.n_p:
        say(
            f"  swapped   optimizer sub-groups N_s = {sw.n_s:,}, gradients N_g = {sw.n_g:,}"
            + (f", {dt} parameters N_p = {sw.n_p:,}" if sw.n_p else "")
        )
    t = Table(
        box=None, pad_edge=False, header_style="bold", title="NVMe I/O model (GiB = 2^30 bytes)"
    )
    for col in ("", "READ GiB", "WRITE GiB", "READ", "WRITE"):
        t.add_column(col, justify="left" if not col else "right")
    rows: list[tuple[str, IoVolume | None]] = [
        ("initialisation", e.init),
        ("first step", e.first_step),
        ("initialisation + first step", e.init_first),
        ("steady step", e.steady_step),
    ]
    if e.first_update is not None and e.update is not None:
        k = e.update_interval
        rows += [
            (f"first update step (step {k})", e.first_update),
            (f"later update steps ({2 * k}, {3 * k}, ...)", e.update),
            (f"mean of a later interval ({k} steps)", e.interval_mean(first=False)),
        ]
    for label, v in rows:
        if v is None:
            continue
        t.add_row(
            label,
            f"{v.read / GIB:.3f}",
            f"{v.write / GIB:.3f}",
            per_n(v.read, n),
            per_n(v.write, n),
        )
    if e.nvme_bytes:
        con.print(t)
    say(
        f"  needs     NVMe {_gib(e.nvme_bytes)} GiB ({per_n(e.nvme_bytes, n)}), "
        f"GPU {_gib(e.gpu_bytes)} GiB, host RAM {_gib(e.host_bytes)} GiB at its peak "
        f"(activations {_gib(e.activation_bytes)} GiB)"
    )
    for line in study_lines(p, e):
        say(line)
    for why in study_differences(p):
        say(f"  differs from the study: {why}")
    if e.host is not None:
        say("  host RAM  (per process; the peak is the steady sum plus the larger transient)")
        for label, b in e.host.terms():
            if b:
                say(f"    {b / GIB:7.1f} GiB  {label}")
        say(f"    {e.host.steady / GIB:7.1f} GiB  steady; {e.host_bytes / GIB:.1f} GiB peak")
        zo = cfg.get("zero_optimization", {})
        sg = int(zo.get("sub_group_size", 1_000_000_000))
        if zo.get("offload_optimizer", {}).get("device") in ("cpu", "nvme") and sg != 10**9:
            alt = copy.deepcopy(cfg)
            alt["zero_optimization"]["sub_group_size"] = 10**9
            peak = estimate(p, alt).host_bytes
            if peak != e.host_bytes:
                say(
                    f"  sub_group_size {sg:.0e}: DeepSpeed's default (1e9) would peak at "
                    f"{peak / GIB:.1f} GiB; the step time is the same with both (1B on an "
                    "H100: benchmarks/results/gpu-study-h100.md)"
                )


def _gib_n(gib: float | None, row: StudyRow) -> str:
    return "-" if gib is None else f"{gib:.1f} GiB ({row.per_n(gib):.1f}N)"


def study_lines(p: Preset, e: Estimate) -> list[str]:
    """The study's published row for this preset beside the model, per parameter: the study's
    N (14.22e9) is not this preset's."""
    row = study_row(p)
    if row is None:
        return []
    n = e.params
    out = [
        f"  study     '{row.case}' (its N = {row.params:.4g}): space {_gib_n(row.space_gib, row)}, "
        f"init + first step read {_gib_n(row.read_gib, row)}, write {_gib_n(row.write_gib, row)}; "
        f"step {row.step_s} s, optimizer {row.optimizer_s} s"
    ]
    if row.read_gib is not None:
        out.append(
            f"  model     space {per_n(e.nvme_bytes, n)}, init + first step read "
            f"{per_n(e.init_first.read, n)}, write {per_n(e.init_first.write, n)} "
            f"(N = {n:.4g} here)"
        )
    return out


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
        s = io.get(label)
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
        t.add_row(
            str(e["step"]),
            _cell(e["forward_s"]),
            _cell(e["backward_s"]),
            _cell(e["optimizer_s"]),
            _cell(e["step_s"]),
            _cell(e["tokens_per_s"]),
            _cell(e["loss"]),
            _gib(e.get("peak_accel_bytes")),
            _gib(e.get("host_rss_peak_bytes")),
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
            _gib3(r.get("read_bytes_per_step")),
            _gib3(r.get("write_bytes_per_step")),
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


def print_run(con: Console, result: dict[str, Any]) -> None:
    con.print(steps_table(result))
    con.print()
    for extra in (ranks_table(result), drives_table(result)):
        if extra is not None:
            con.print(extra)
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


def print_drive_plan(con: Console, plan: dict[str, Any]) -> None:
    """--drives: the step on K drives, what bounds it, and the answer to --target-step."""
    top = max((max(p["read_bw_bytes_s"], p["write_bw_bytes_s"]) for p in plan["plans"]), default=0)
    unit, scale = scale_for(top)
    t = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title=f"RAID0 of K drives like the swept one ({unit} = 2^{int(scale).bit_length() - 1} bytes)",
    )
    for col in (
        "DRIVES",
        f"READ {unit}/s",
        f"WRITE {unit}/s",
        "BOUND BY",
        "OPTIMIZER s",
        "STEP s",
        "WAIT ON DRIVES",
    ):
        t.add_column(col, justify="right" if col != "BOUND BY" else "left")
    for p in plan["plans"]:
        io, rest = p["io_s"], p["compute_s"]
        wait = "-" if io is None or rest is None else f"{io:.2f} s of {io + rest:.2f} s"
        t.add_row(
            str(p["drives"]),
            f"{p['read_bw_bytes_s'] / scale:.2f}",
            f"{p['write_bw_bytes_s'] / scale:.2f}",
            p["bound_by"],
            "-" if p["optimizer_s"] is None else f"{p['optimizer_s']:.2f}",
            "-" if p["step_s"] is None else f"{p['step_s']:.2f}",
            wait + (" (drive-bound)" if p["drive_bound"] else ""),
        )
    con.print(t)
    con.print("  limits:", soft_wrap=True)
    for lim in plan["limits"]:
        con.print(f"    {lim['text']}", soft_wrap=True)
    for m in plan["missing"]:
        con.print(f"    {m}", soft_wrap=True)
    first = plan["plans"][0]
    for n in first.get("notes") or []:
        con.print(f"  note: {n}", soft_wrap=True)
    free = next((p for p in plan["plans"] if p["drive_bound"] is False), None)
    if free is not None and first["drive_bound"]:
        con.print(
            f"  the step stops being drive-bound at {free['drives']} drives: from there it waits "
            "longer on forward + backward and CPU Adam than on the drives",
            soft_wrap=True,
        )
    if plan.get("target"):
        con.print(
            f"target step {plan['target']['step_s']:.2f} s: {plan['target']['answer']}",
            soft_wrap=True,
        )
    if plan.get("study"):
        s = plan["study"]
        con.print(f"  study: {s['case']}, {s['step_s']} s measured", soft_wrap=True)
