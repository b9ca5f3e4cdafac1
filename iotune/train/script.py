"""Your own training script traced (`iotune trace [--model M --ds-config C] -- COMMAND`): the
drives behind the swap folder, DeepSpeed's aio block as the focus size, step boundaries
from the swap folder (:mod:`iotune.train.swapwatch`), and the estimate beside what each step
moved. The run tells iotune itself what it ran with (:mod:`iotune.train.observe`): its
config, world size, batch, dtype and model make the estimate, so no flag is needed; where
--model/--ds-config and the batch options are given too, they plan the trace's drives and
any figure the run used otherwise is named in one line."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iotune.errors import IotuneError, UsageError
from iotune.probes.mounts import existing_ancestor
from iotune.units import scale_for

if TYPE_CHECKING:
    from rich.console import Console

    from iotune.model.estimate import Estimate, IoVolume
    from iotune.model.presets import Preset
    from iotune.trace.request import TraceRequest
    from iotune.train.observe import Learned, Observer


@dataclass
class ScriptPlan:
    #: from --model/--ds-config and the batch options; None where only the run tells
    preset: Preset | None
    est: Estimate | None
    nvme_path: Path | None
    devices: str | None
    target: str | None
    focus: int
    #: the focus size was said (--focus-size, or the config's aio block)
    focus_known: bool = True
    #: iotune's hook on the command's PYTHONPATH (--learn)
    learn: bool = True

    def trace(self, req: TraceRequest) -> dict[str, Any]:
        """Trace COMMAND with iotune's hook on its PYTHONPATH and the step watch appending
        its events; the result gains ``script`` (the estimate beside each step found) where
        there is an estimate, and ``learned`` (what the run said, and the notes on it)."""
        from iotune.trace.runner import Tracer
        from iotune.train.observe import Observer, SwapSite, hook_env

        learn = req.out / "learn"
        if self.learn:
            req.env = {**req.env, **hook_env(learn)}
        tracer = Tracer(req)
        site = None
        if self.preset is not None and self.est is not None and self.nvme_path is not None:
            site = SwapSite(self.nvme_path, self.est.swapped.n_s > 0, self.preset.ranks)
        with Observer(learn, tracer.events_path, site=site, on_event=tracer.wake.set) as obs:
            result = tracer.run()
        script, learned = self.account(result, obs, req)
        if script is not None:
            result["script"] = script
        result["learned"] = learned
        return result

    def account(
        self, result: dict[str, Any], obs: Observer, req: TraceRequest
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The estimate beside the steps (the run's own figures where it told them, else
        the flags'), and what the run told with the notes on it."""
        from iotune.train.observe import differences, disagreement, learned_estimate, read_learned

        learned, errors = read_learned(obs.learn)
        notes = []
        if errors:
            notes.append(
                "iotune's hook in the run could not do everything (the run went on): "
                + "; ".join(errors[:3])
                + (f"; and {len(errors) - 3} more" if len(errors) > 3 else "")
            )
        if obs.failed:
            notes.append(f"the swap folder's watch did not start: {obs.failed}")
        run: tuple[Preset, Estimate] | None = None
        if learned is not None:
            try:
                run = learned_estimate(learned)
            except IotuneError as exc:
                notes.append(f"no estimate from the run's own figures: {exc.message}")
        line = None
        if run is not None and self.preset is not None and self.est is not None:
            line = disagreement(differences(self.preset, self.est, *run))
        told = (self.preset, self.est) if self.preset is not None and self.est else None
        use = run or told
        site = obs.site
        nvme = site.nvme_path if site is not None else self.nvme_path
        if learned is not None:
            notes += _where_notes(learned, nvme, req, self.focus_known)
        doc = None
        if use is not None:
            doc = compare(use[0], use[1], nvme, result.get("steps") or [], obs.inited)
            doc["late_cuts"] = obs.late_cuts
            doc["events_lost"] = obs.overflowed
            doc["estimate_from"] = "run" if run is not None else "options"
            doc["disagreement"] = line
        return doc, {"run": _summary(learned), "notes": notes}


def _summary(learned: Learned | None) -> dict[str, Any] | None:
    """What rank 0 said, without its config and tensors (in learn/ beside the trace)."""
    if learned is None:
        return None
    d = learned.doc
    keys = (
        "world_size",
        "local_world_size",
        "micro_batch",
        "ga",
        "train_batch_size",
        "dtype",
        "zero_stage",
        "offload_optimizer",
        "offload_param",
        "optimizer_nvme_path",
        "param_nvme_path",
        "deepspeed",
        "accelerator",
        "cwd",
        "argv",
    )
    out = {k: d.get(k) for k in keys}
    model = d.get("model") or {}
    out["architecture"] = model.get("architecture")
    out["params"] = sum(int(t[1]) for t in model.get("tensors") or [])
    out["engines_reported"] = learned.ranks
    out["config_file"] = str(learned.folder / "ds_config.json")
    return out


def _where_notes(
    learned: Learned, nvme: Path | None, req: TraceRequest, focus_known: bool
) -> list[str]:
    """The run's swap folder on drives this trace does not count, and an aio block the
    focus size does not count apart: said, as neither can change once the trace runs."""
    from iotune.probes.sysfs import SysTree
    from iotune.trace.targets import resolve_path
    from iotune.units import format_size

    notes = []
    if nvme is not None:
        try:
            disks = resolve_path(SysTree("/"), str(existing_ancestor(nvme))).disks
        except IotuneError:
            disks = ()
        if disks and not set(disks) & set(req.targets.disks):
            notes.append(
                f"the run's swap folder {nvme} is on {', '.join(disks)}, which this trace did "
                f"not count: trace it with --target {existing_ancestor(nvme)}"
            )
    elif learned.doc.get("zero_stage") is not None:
        notes.append(
            "the run swaps nothing to NVMe (offload_optimizer "
            f"{learned.doc.get('offload_optimizer')}, offload_param "
            f"{learned.doc.get('offload_param')}): there is no swap folder to cut its steps at"
        )
    cfg = learned.doc.get("config") or {}
    aio = cfg.get("aio") if isinstance(cfg, dict) else None
    block = aio.get("block_size") if isinstance(aio, dict) else None
    from iotune.model.dsconfig import DEFAULT_AIO_BLOCK

    block = int(block) if isinstance(block, (int, float)) else DEFAULT_AIO_BLOCK
    if nvme is not None and not focus_known and block != req.focus:
        notes.append(
            f"the run's aio block_size is {format_size(block)}; this trace counted requests of "
            f"{format_size(req.focus)} apart (--focus-size {format_size(block)} counts its blocks)"
        )
    return notes


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
    from iotune.model.custom import pick_preset
    from iotune.model.dsconfig import DEFAULT_AIO_BLOCK
    from iotune.model.dsconfig import ds_config as build_config
    from iotune.model.estimate import estimate

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


def plan_learning(devices: str | None, target: str | None, focus: int) -> ScriptPlan:
    """COMMAND with no --model/--ds-config: the drives and focus size as for any command,
    the estimate and the swap folder from what the run tells (iotune.train.observe)."""
    return ScriptPlan(
        preset=None,
        est=None,
        nvme_path=None,
        devices=devices,
        target=target,
        focus=focus,
        focus_known=False,
    )


def compare(
    preset: Preset,
    e: Estimate,
    nvme_path: Path | None,
    steps: list[dict[str, Any]],
    inited: bool,
) -> dict[str, Any]:
    """Each interval the step watch cut (initialisation, then steps) with its prediction,
    and the whole run's measured bytes beside the estimate for that many steps."""
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
        "preset": preset.name,
        "model": preset.geometry.family,
        "params": e.params,
        "nvme_path": str(nvme_path) if nvme_path is not None else None,
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
    """The estimate beside each step the swap folder showed, and where the run's own figures
    differ from the options, the line that says so."""
    _print_rows(con, doc)
    if doc.get("disagreement"):
        con.print(f"[yellow]note[/]: {doc['disagreement']}", soft_wrap=True)


def _print_rows(con: Console, doc: dict[str, Any]) -> None:
    from rich.table import Table

    rows = doc["rows"]
    if not rows:
        if doc["nvme_path"] is None:
            return  # said among the notes: nothing is swapped to NVMe
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


def print_run(con: Console, learned: dict[str, Any]) -> None:
    """What the run told iotune it ran with, in one line."""
    run = learned.get("run")
    if not run:
        return
    where = []
    for what, dev, path in (
        ("optimizer state", run["offload_optimizer"], run["optimizer_nvme_path"]),
        ("parameters", run["offload_param"], run["param_nvme_path"]),
    ):
        if dev not in (None, "none"):
            at = f" at {path}" if path else ""
            if path and not Path(path).is_absolute():  # DeepSpeed's is the process's folder's
                at = f" at {path!r} ({Path(run['cwd'] or '.') / path})"
            where.append(f"{what} on {dev}{at}")
    con.print(
        f"the run's own figures: {run['architecture']}, N = {run['params']:,}, world size "
        f"{run['world_size']}, micro-batch {run['micro_batch']}, accumulation {run['ga']}, "
        f"{run['dtype']}, ZeRO stage {run['zero_stage']}"
        + (", " + ", ".join(where) if where else "")
        + f" (DeepSpeed {run['deepspeed']}; its resolved config: {run['config_file']})",
        soft_wrap=True,
    )


def print_learned(con: Console, learned: dict[str, Any]) -> None:
    """The notes on what the run told iotune, one line each."""
    for line in learned.get("notes") or []:
        con.print(f"[yellow]note[/]: {line}", soft_wrap=True)


def _has_main_guard(script: Path) -> bool:
    import ast

    tree = ast.parse(script.read_text(errors="replace"), filename=str(script))
    for node in tree.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            return True
    return False


def check_script_writer(cfg: dict[str, Any], command: tuple[str, ...]) -> None:
    """A traced script whose config asks for DeepSpeed's fast or decoupled checkpoint writer:
    refused before it starts where its first save would fail. The writers read CROSS_RANK
    and CROSS_SIZE (runtime/model_checkpointing/utils.py), which only DeepSpeed's launcher
    sets; the decoupled engine starts its writer with multiprocessing's spawn, which imports
    the script again: without an ``if __name__ == "__main__":`` guard the child runs the
    training, and fails."""
    writer = (cfg.get("checkpoint") or {}).get("writer")
    if not writer or not command:
        return
    kind = "decoupled" if writer.get("decoupled") else str(writer.get("type", "fast"))
    head = " ".join(Path(a).name for a in command[:4])
    if "deepspeed" not in head and not all(k in os.environ for k in ("CROSS_RANK", "CROSS_SIZE")):
        raise UsageError(
            f"the config's {kind} checkpoint writer reads CROSS_RANK and CROSS_SIZE, which only "
            "DeepSpeed's launcher sets: the script's first save would fail (KeyError: "
            "'CROSS_SIZE')",
            hint="launch it with `deepspeed`, or export CROSS_RANK=0 CROSS_SIZE=1 (one node)",
        )
    if kind == "decoupled":
        script = next((Path(a) for a in command if a.endswith(".py") and Path(a).is_file()), None)
        if script is not None and not _has_main_guard(script):
            raise UsageError(
                f"the config's decoupled checkpoint writer starts a process that imports "
                f'{script.name} again, which has no `if __name__ == "__main__":` guard: the '
                "writer's process would run the training, and fail",
                hint=f'put {script.name}\'s training under `if __name__ == "__main__":`',
            )
