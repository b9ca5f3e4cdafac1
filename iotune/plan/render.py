"""What `iotune presets` and `iotune estimate` print: the presets table, a preset's
estimate (model, DeepSpeed set-up, the I/O model, host RAM), the step-time prediction and
the drives planner's table."""

from __future__ import annotations

import copy
from typing import Any

from rich.console import Console
from rich.table import Table

from iotune.model.dsconfig import model_element_size, study_differences
from iotune.model.estimate import Estimate, IoVolume, estimate, per_n
from iotune.model.presets import Preset, resolve_dtype
from iotune.model.published import StudyRow, study_row
from iotune.units import GIB, amount, format_size, gib_text, scale_for


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
            "geometry": p.geometry.model_config(),
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
            gib_text(e.nvme_bytes) if e.nvme_bytes else "-",
            gib_text(e.gpu_bytes),
            gib_text(e.host_bytes),
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
        f"  model     {p.geometry.family} {p.geometry.describe()}: N = {n:,} parameters ({_b(n)}), "
        f"micro-batch {p.micro_batch} x {p.seq_len} tokens, accumulation {p.ga}, "
        f"{'gradient checkpointing, ' if p.gradient_checkpointing else ''}{dt}, Adam, {p.accelerator}"
    )
    if p.accelerator == "cpu":
        say(f"  dtype     {dt}: {resolve_dtype(p).why}")
    if p.ds_filled:
        who = (
            "accelerate's prepare() fills them (Accelerator._prepare_deepspeed)"
            if p.strategy.about.startswith("accelerate")
            else "the Hugging Face Trainer fills them (transformers.integrations.deepspeed)"
        )
        say(f'  auto      {len(p.ds_filled)} "auto" values filled as {who}:')
        width = max(len(f"{key} = {value}") for key, value, _ in p.ds_filled)
        for key, value, src in p.ds_filled:
            say(f"              {f'{key} = {value}':<{width}}  from {src}")
    for c in e.caveats:
        say(f"  [yellow]caveat[/]    {c}")
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
    # the activations live where forward and backward run: in the GPU's figure on a GPU,
    # in host RAM's on the CPU
    acts = f"activations {gib_text(e.activation_bytes)} GiB of it"
    gpu_part = f"GPU {gib_text(e.gpu_bytes)} GiB ({acts})" if e.gpu_bytes else "no GPU"
    host_part = f"host RAM {gib_text(e.host_bytes)} GiB at its peak" + (
        "" if e.gpu_bytes else f" ({acts})"
    )
    say(
        f"  needs     NVMe {gib_text(e.nvme_bytes)} GiB ({per_n(e.nvme_bytes, n)}), {gpu_part}, {host_part}"
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


def print_drive_plan(con: Console, plan: dict[str, Any]) -> None:
    """--drives: the step on K drives, what bounds it, what each drive writes, the answer to
    --target-step."""
    rows = plan["plans"]
    top = max((max(p["read_bw_bytes_s"], p["write_bw_bytes_s"]) for p in rows), default=0)
    unit, scale = scale_for(top)
    drive = plan.get("drive")
    like = (
        f"described by {drive['label']}'s datasheet"
        if drive and (plan.get("derate") or {}).get("measured") is False
        else "like the one measured"
    )
    study = any(p.get("study_step_s") for p in rows)
    node = plan.get("node") or {}
    ranks, nodes = int(node.get("ranks") or 1), int(node.get("nodes") or 1)
    t = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title=f"RAID0 of K drives {like} ({unit} = 2^{int(scale).bit_length() - 1} bytes)",
    )
    cols = ["DRIVES"] + (["PER GPU"] if ranks > 1 else []) + (["IN ALL"] if nodes > 1 else [])
    cols += [f"READ {unit}/s", f"WRITE {unit}/s", "BOUND BY", "OPTIMIZER s", "STEP s"]
    cols += ["WAIT ON DRIVES"] + (["STUDY s"] if study else [])
    for col in cols:
        t.add_column(col, justify="left" if col == "BOUND BY" else "right")
    for p in rows:
        io, rest = p["io_s"], p["compute_s"]
        # of the step as its column prints it (the two parts are each rounded apart)
        whole = p["step_s"] if p["step_s"] is not None else (io or 0) + (rest or 0)
        wait = "-" if io is None or rest is None else f"{io:.2f} s of {whole:.2f} s"
        k = int(p["drives"])
        cells = [
            str(k),
            *([f"{k / ranks:g}"] if ranks > 1 else []),
            *([str(k * nodes)] if nodes > 1 else []),
            f"{p['read_bw_bytes_s'] / scale:.2f}",
            f"{p['write_bw_bytes_s'] / scale:.2f}",
            p.get("step_bound") or p["bound_by"],
            "-" if p["optimizer_s"] is None else f"{p['optimizer_s']:.2f}",
            "-" if p["step_s"] is None else f"{p['step_s']:.2f}",
            wait + (" (drive-bound)" if p["drive_bound"] else ""),
        ]
        if study:
            cells.append("-" if p.get("study_step_s") is None else f"{p['study_step_s']:.2f}")
        t.add_row(*cells)
    con.print(t)
    if ranks > 1 or nodes > 1:
        con.print(
            f"  K drives on each node, shared by its {ranks} rank(s), a GPU each"
            + (f"; {nodes} nodes, each with its own (IN ALL)" if nodes > 1 else ""),
            soft_wrap=True,
        )
    short = [p["drives"] for p in rows if p.get("fits") is False]
    if short:
        need = plan.get("nvme_bytes")
        cap = (plan.get("drive") or {}).get("capacity_bytes") or plan.get("capacity_bytes")
        con.print(
            f"  does not fit: {', '.join(map(str, short))} drive(s)"
            + (f" of {cap / 1e9:,.0f} GB ({cap / GIB:,.1f} GiB) each" if cap else "")
            + (f" hold less than the run's {need / GIB:,.1f} GiB on NVMe" if need else "")
            + ": their steps are shown, but the state does not fit",
            soft_wrap=True,
        )
    _print_endurance(con, plan)
    con.print("  limits:", soft_wrap=True)
    for lim in plan["limits"]:
        con.print(f"    {lim['text']}", soft_wrap=True)
    for m in plan["missing"]:
        con.print(f"    {m}", soft_wrap=True)
    for n in plan.get("notes") or []:
        con.print(f"  {n}", soft_wrap=True)
    first = rows[0]
    for n in first.get("notes") or []:
        con.print(f"  note: {n}", soft_wrap=True)
    free = next((p for p in rows if p["drive_bound"] is False), None)
    if free is not None and first["drive_bound"]:
        con.print(
            f"  the step stops being drive-bound at {free['drives']} drives: from there it waits "
            "longer on forward + backward and CPU Adam than on the drives",
            soft_wrap=True,
        )
    if plan.get("target"):
        tg = plan["target"]
        asked = tg.get("asked")
        con.print(f"target step {asked}: {tg['answer']}", soft_wrap=True)
    if plan.get("study"):
        s = plan["study"]
        con.print(f"  study: {s['case']}, {s['step_s']} s measured", soft_wrap=True)


def _print_endurance(con: Console, plan: dict[str, Any]) -> None:
    """Each drive's writes against its rated endurance (TB = 10^12 bytes, as TBW counts)."""
    rows = [p for p in plan["plans"] if p.get("endurance")]
    if not rows:
        return
    drive = plan.get("drive") or {}
    t = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title="each drive's writes (TB = 10^12 bytes)",
    )
    for col in ("DRIVES", "GiB/STEP", "TB/DAY", "DWPD", "DAYS TO TBW"):
        t.add_column(col, justify="right")
    for p in rows:
        en = p["endurance"]
        day = en["write_bytes_per_drive_day"]
        t.add_row(
            str(p["drives"]),
            f"{en['write_bytes_per_drive_step'] / GIB:.2f}",
            "-" if day is None else f"{day / 1e12:.2f}",
            "-" if en["dwpd"] is None else f"{en['dwpd']:.2f}",
            "-" if en["days_to_rated_writes"] is None else f"{en['days_to_rated_writes']:,.0f}",
        )
    con.print(t)
    rated = drive.get("rated_writes_bytes")
    if rated:
        rating = f"rated {rated / 1e12:,.0f} TBW"
        if drive.get("dwpd"):
            rating += f", {drive['dwpd']:g} DWPD"
        con.print(
            f"  {drive['label']}: {rating} (datasheet), writing around the clock", soft_wrap=True
        )


def print_checkpoint_plan(con: Console, ck: dict[str, Any]) -> None:
    """estimate --checkpoint-every: a save's time and share on each width, each writer's
    on the swept volume, and the answer."""
    if ck["plans"]:
        t = Table(
            box=None,
            pad_edge=False,
            header_style="bold",
            title=f"a save every {ck['every']} step(s) on a {ck['level'].upper()} of W drives "
            f"(GiB = 2^30 bytes)",
        )
        for col in ("W", "MEMBER GiB", "READ s", "WRITE s", "SAVE s", "BOUND BY", "SHARE"):
            t.add_column(col, justify="left" if col == "BOUND BY" else "right")
        for r in ck["plans"]:
            t.add_row(
                str(r["width"]),
                f"{r['member_write_bytes'] / GIB:.2f}",
                "-" if r["read_s"] is None else f"{r['read_s']:.2f}",
                f"{r['write_s']:.2f}",
                f"{r['save_s']:.2f}",
                r["bound_by"],
                f"{100 * r['share']:.1f}%",
            )
        con.print(t)
    if ck.get("writers"):
        _saves_table(
            con,
            f"each writer, a save every {ck['every']} step(s) on {ck['writers_volume']} "
            "(iotune sweep-checkpoint, scaled to this save)",
            "writer",
            ck["writers"],
        )
    if ck.get("copies"):
        _saves_table(
            con,
            f"each copy of the swap files, a save every {ck['every']} step(s), "
            f"{ck['copies_volumes']} (iotune sweep-checkpoint --copy-from, scaled to this save)",
            "copy",
            ck["copies"],
        )
    read = ck["offload_read_bytes_s"]
    drive = ck.get("drive")
    con.print(
        f"  each save: {ck['save_bytes'] / GIB:.2f} GiB"
        + (
            f", read back from the offload volume, {ck['offload']}, at {amount(read, '/s')}"
            if read
            else ""
        )
        + f"; the step {ck['step_s']:.2f} s"
        + (
            f"; the drives: {drive['name']} (write derated x {ck['write_derate']:.2f})"
            if drive
            else ""
        ),
        soft_wrap=True,
    )
    if drive and ck.get("write_derate_source"):
        con.print(
            f"  the checkpoint drives' writes: x {ck['write_derate']:.2f} of the datasheet's, "
            f"{ck['write_derate_source']}",
            soft_wrap=True,
        )
    if ck.get("writers_note"):
        con.print(f"  writers: {ck['writers_note']}", soft_wrap=True)
    if ck.get("copies_note"):
        con.print(f"  copies: {ck['copies_note']}", soft_wrap=True)
    con.print(f"  answer: {ck['answer']}", soft_wrap=True)


def _saves_table(con: Console, title: str, key: str, rows: list[dict[str, Any]]) -> None:
    """Saves measured on the volumes (each writer's, or each copy's): what the step waits
    for, when durable, and the share of the training."""
    t = Table(box=None, pad_edge=False, header_style="bold", title=title)
    for col in (key.upper(), "HOW", "STEP WAITS s", "DURABLE s", "SHARE"):
        t.add_column(col, justify="left" if col in (key.upper(), "HOW") else "right")
    for r in rows:
        t.add_row(
            r[key],
            r["how"],
            f"{r['waits_s']:.2f}",
            f"{r['durable_s']:.2f}",
            f"{100 * r['share']:.1f}%",
        )
    con.print(t)
