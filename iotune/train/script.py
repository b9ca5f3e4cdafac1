"""Your own training script traced (`iotune trace --model M --ds-config C -- COMMAND`): the
drives behind the config's nvme_path, DeepSpeed's aio block as the focus size, step
boundaries from the swap folder (:mod:`iotune.train.swapwatch`), and the estimate of that
model and config beside what each step moved."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iotune.errors import UsageError
from iotune.probes.mounts import existing_ancestor
from iotune.units import scale_for

if TYPE_CHECKING:
    from rich.console import Console

    from iotune.trace.runner import TraceRequest
    from iotune.train.estimate import Estimate, IoVolume
    from iotune.train.presets import Preset


@dataclass
class ScriptPlan:
    preset: Preset
    est: Estimate
    nvme_path: Path
    devices: str | None
    target: str | None
    focus: int

    def trace(self, req: TraceRequest) -> dict[str, Any]:
        """Trace COMMAND with the step watch appending its events; the result gains
        ``script``: the estimate beside each step found."""
        from iotune.trace.runner import Tracer
        from iotune.train.swapwatch import StepWatch

        tracer = Tracer(req)
        optimizer = self.est.swapped.n_s > 0
        with StepWatch(
            self.nvme_path,
            tracer.events_path,
            optimizer=optimizer,
            ranks=self.preset.ranks,
            on_event=tracer.wake.set,
        ) as watch:
            result = tracer.run()
        doc = compare(self, result.get("steps") or [], watch.inited)
        doc["late_cuts"] = watch.late_cuts
        doc["events_lost"] = watch.overflowed
        result["script"] = doc
        return result


def plan_script(
    model: str | None,
    ds_config: str | None,
    *,
    micro_batch: int | None,
    seq_len: int | None,
    ga: int | None,
    ranks: int | None,
    sets: tuple[str, ...],
    devices: str | None,
    target: str | None,
) -> ScriptPlan:
    from iotune.train.custom import pick_preset
    from iotune.train.dsconfig import DEFAULT_AIO_BLOCK
    from iotune.train.dsconfig import ds_config as build_config
    from iotune.train.estimate import estimate

    p = pick_preset(
        None,
        model,
        ds_config,
        micro_batch=micro_batch,
        seq_len=seq_len,
        ga=ga,
        ranks=ranks,
        sets=(*sets, *((f"ranks={ranks}",) if ranks else ())),
    )
    if not p.nvme_path:
        raise UsageError(
            f"{ds_config} offloads nothing to NVMe: there is no swap folder to trace",
            hint="trace a script whose config has offload_optimizer or offload_param on nvme, "
            "or use --devices/--target without --model",
        )
    cfg = build_config(p)
    nvme = Path(p.nvme_path)
    return ScriptPlan(
        preset=p,
        est=estimate(p, cfg),
        nvme_path=nvme,
        devices=devices,
        # the swap folder, or its nearest existing folder: DeepSpeed makes it itself
        target=target if (devices or target) else str(existing_ancestor(nvme)),
        focus=int(cfg.get("aio", {}).get("block_size", DEFAULT_AIO_BLOCK)),
    )


def _io(v: IoVolume) -> dict[str, int]:
    return {"read": v.read, "write": v.write}


def compare(plan: ScriptPlan, steps: list[dict[str, Any]], inited: bool) -> dict[str, Any]:
    """Each interval the step watch cut (initialisation, then steps) with its prediction,
    and the whole run's measured bytes beside the estimate for that many steps."""
    e = plan.est
    rows = []
    n_steps = 0
    for s in steps:
        label = s["label"]
        kind, _, num = label.partition(":")
        if kind == "init":
            pred = e.init
        elif kind == "step":
            n_steps = max(n_steps, int(num))
            pred = e.first_step if int(num) == 1 else e.steady_step
        else:
            continue
        rows.append(
            {
                "label": label,
                "measured": {"read": s["read"]["bytes"], "write": s["write"]["bytes"]},
                "predicted": _io(pred),
            }
        )
    total_pred = e.init + e.first_step + e.steady_step * max(0, n_steps - 1) if n_steps else None
    measured_total = {op: sum(r["measured"][op] for r in rows) for op in ("read", "write")}
    return {
        "preset": plan.preset.name,
        "model": plan.preset.geometry.family,
        "params": e.params,
        "nvme_path": str(plan.nvme_path),
        "boundaries": "DeepSpeed's swap folder (every optimizer or parameter file rewritten)",
        "initialised": inited,
        "steps_found": n_steps,
        "rows": rows,
        "measured_total": measured_total,
        "predicted_total": _io(total_pred) if total_pred is not None else None,
        "estimate": {
            "nvme_bytes": e.nvme_bytes,
            "init": _io(e.init),
            "first_step": _io(e.first_step),
            "steady_step": _io(e.steady_step),
        },
    }


def print_script(con: Console, doc: dict[str, Any]) -> None:
    """The estimate beside each step the swap folder showed."""
    from rich.table import Table

    rows = doc["rows"]
    if not rows:
        con.print(
            f"[yellow]no step boundary seen in {doc['nvme_path']}[/]: DeepSpeed wrote no "
            "optimizer or parameter file there (another nvme_path, or the script stopped "
            "before its first step); the totals above are the whole run"
        )
        return
    sizes = [r[k][op] for r in rows for k in ("measured", "predicted") for op in ("read", "write")]
    unit, div = scale_for(max(sizes))
    t = Table(
        title=f"{doc['preset']}: {doc['model']}, N = {doc['params']:,}; steps cut at "
        f"{doc['boundaries']}",
        box=None,
        header_style="bold",
    )
    for col in ("", f"READ {unit}", "predicted", f"WRITE {unit}", "predicted", "read diff"):
        t.add_column(col, justify="left" if not col else "right")
    for r in rows:
        m, p = r["measured"], r["predicted"]
        diff = f"{(m['read'] - p['read']) / p['read']:+.1%}" if p["read"] else "-"
        t.add_row(
            r["label"].replace(":", " ").replace("init 0", "initialisation"),
            f"{m['read'] / div:.3f}",
            f"{p['read'] / div:.3f}",
            f"{m['write'] / div:.3f}",
            f"{p['write'] / div:.3f}",
            diff,
        )
    con.print(t)
    if doc["predicted_total"]:
        m, p = doc["measured_total"], doc["predicted_total"]
        con.print(
            f"total over initialisation and {doc['steps_found']} step(s): read "
            f"{m['read'] / div:.3f} {unit} (predicted {p['read'] / div:.3f}), written "
            f"{m['write'] / div:.3f} {unit} (predicted {p['write'] / div:.3f}); each cut falls "
            "where the round's last state file has been written and closed"
        )
    if doc.get("late_cuts") or doc.get("events_lost"):
        con.print(
            "[yellow]some cuts are late[/]: "
            + (
                f"{doc['late_cuts']} round(s) ended when a file was written again (their "
                "files were not the model's), "
                if doc.get("late_cuts")
                else ""
            )
            + ("the kernel dropped inotify events, " if doc.get("events_lost") else "")
            + "so I/O can shift between neighbouring steps"
        )
