"""Running a study: each run through the same runner as `iotune trace --run`, in its own
directory, one summary record appended (and fsynced) when it ends, so that `--resume`
keeps every finished run and redoes only the one in flight."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iotune.errors import IotuneError, UsageError
from iotune.model.dsconfig import ds_config
from iotune.model.estimate import Estimate, estimate
from iotune.model.presets import Preset, apply_sets, base_name, get_preset, parse_sets
from iotune.plan.measured import Baseline
from iotune.plan.rundoc import load_trace
from iotune.proc import pid_alive
from iotune.records import append_record, host_facts, read_records
from iotune.study import record as rec
from iotune.study.plan import Item, eta, plan_row, weight, with_ga
from iotune.study.volumes import Volume, member_faults
from iotune.train.launch import Launch
from iotune.train.request import RunRequest

if TYPE_CHECKING:
    from iotune.train.preflight import Gpus

SPEC = "study.json"
RUNS = "runs.jsonl"
#: the strategy whose forward + backward the step-time prediction of the others uses
BASELINE = "opt_ram"


class StudyInterrupted(IotuneError):
    """Ctrl-C or SIGTERM stopped the study; finished runs are kept."""


@dataclass
class StudySpec:
    items: list[dict[str, Any]]  # {"preset": NAME, "base": BASE, "ga": N, "steps": N}
    backend: str
    nvme_path: str | None = None
    raid_path: str | None = None
    aio_config: str | None = None
    threads_config: str | None = None
    ranks: int = 1  # every run on this many ranks of this node (DeepSpeed's launcher)
    # --volume: each NVMe run once per volume (Volume.to_json), RAM runs once
    volumes: list[dict[str, Any]] = field(default_factory=list)
    sets: list[str] = field(default_factory=list)  # --set KEY=VALUE of every run
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    host: dict[str, Any] = field(default_factory=host_facts)

    @staticmethod
    def of(items: list[Item], backend: str, **kw: Any) -> StudySpec:
        rows = []
        names = [v["name"] for v in kw.get("volumes") or []]
        for it in items:
            p = it.preset
            row = {"preset": p.name, "base": base_name(p.name), "ga": p.ga, "steps": p.steps}
            for v in names if p.strategy.uses_nvme and names else [None]:
                rows.append({**row, "volume": v})
        return StudySpec(rows, backend, **kw)

    def volume(self, name: str | None) -> Volume | None:
        return next((Volume.from_json(v) for v in self.volumes if v["name"] == name and name), None)

    def aio_config_for(self, volume: str | None) -> str | None:
        """The sweep of the run's volume, else the study's --aio-config."""
        v = self.volume(volume)
        return (v.aio_config if v else None) or self.aio_config

    def presets(self) -> list[Item]:
        out = []
        overrides = parse_sets(tuple(self.sets))
        for r in self.items:
            base = get_preset(r["base"])
            p = apply_sets(with_ga(base, int(r["ga"])), overrides)
            p = replace(p, steps=int(r["steps"]), ranks=self.ranks)
            if p.name != r["preset"]:
                raise UsageError(
                    f"{SPEC}: run {r['preset']} no longer matches preset {r['base']}",
                    hint="the presets file changed since the study started: start a new study",
                )
            out.append(Item(p, r.get("volume")))
        return out

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / (SPEC + ".tmp")
        tmp.write_text(json.dumps(self.__dict__, indent=2) + "\n")
        tmp.replace(out / SPEC)

    @staticmethod
    def load(out: Path) -> StudySpec:
        f = out / SPEC
        try:
            return StudySpec(**json.loads(f.read_text()))
        except FileNotFoundError as exc:
            raise UsageError(
                f"--resume {out}: not a study directory (no {SPEC})",
                hint="name the directory an earlier 'iotune study --out DIR' wrote",
            ) from exc
        except (ValueError, TypeError) as exc:
            raise UsageError(f"{f}: unreadable ({exc})", hint="start a new study") from exc


def run_name(r: dict[str, Any]) -> str:
    """A record's run: preset@volume where volumes are an axis, else the preset."""
    return str(r.get("run") or r["preset"])


def finished(out: Path) -> dict[str, dict[str, Any]]:
    """The runs with a record (ok, failed or skipped), by run name."""
    f = out / RUNS
    return {run_name(r): r for r in read_records(f)} if f.exists() else {}


def nvme_path_for(p: Preset, spec: StudySpec, volume: str | None = None) -> Path | None:
    if not p.strategy.uses_nvme:
        return None
    v = spec.volume(volume)
    if v is not None:
        return Path(v.path)
    given = spec.raid_path if p.strategy.raid else spec.nvme_path
    return Path(given) if given else None


def _est(p: Preset, aio: dict[str, Any] | None) -> Estimate:
    return estimate(p, ds_config(p, aio=aio))


def clear_in_flight(out: Path, p: Preset, nvme: Path | None, run: str | None = None) -> list[str]:
    """What a run killed in flight left: its directory (kept aside under runs/.partial/) and
    its swap directory on the offload path (removed unless its process still lives)."""
    from iotune.train.preflight import SWAP_PREFIX

    said = []
    run = run or p.name
    d = out / "runs" / run
    if d.exists():
        aside = out / "runs" / ".partial" / f"{run}-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.parent.mkdir(parents=True, exist_ok=True)
        d.rename(aside)
        said.append(f"kept the interrupted {run} aside in {aside}")
    root = nvme or (Path(p.nvme_path) if p.nvme_path else None)
    if root and root.is_dir():
        for swap in root.glob(f"{SWAP_PREFIX}{run}-*"):
            pid = swap.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(swap, ignore_errors=True)
                said.append(f"removed {swap}, left by a run that was killed")
    return said


@dataclass
class Progress:
    """What the study tells its user, between runs (the runs print their own lines)."""

    header: Callable[[str], None]
    line: Callable[[str], None]


def _fmt_s(s: float) -> str:
    m, sec = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


def _eta_text(s: float | None) -> str:
    return "time left known after the first run" if s is None else f"about {_fmt_s(s)} left"


def _baseline(p: Preset, done: dict[str, dict[str, Any]]) -> Baseline | None:
    """The finished opt_ram run of the same size and accumulation: its forward + backward
    and its optimizer step, measured."""
    for r in done.values():
        m = r.get("measured") or {}
        if (
            r.get("status") == "ok"
            and r.get("strategy") == BASELINE
            and r.get("size") == p.size
            and r.get("ga") == p.ga
            and m.get("forward_backward_s")
            and r["preset"] != p.name
        ):
            return Baseline(
                float(m["forward_backward_s"]),
                m.get("optimizer_median_s"),
                f"{r['preset']}, measured",
                m.get("backward_s"),
            )
    return None


def run_study(
    out: Path,
    spec: StudySpec,
    progress: Progress | None,
    gpu: Gpus | None,
) -> list[dict[str, Any]]:
    """Run every item without a record; returns every record, in the grid's order."""
    from iotune.plan.measured import measured_inputs
    from iotune.records import load_aio
    from iotune.train import runner as tr
    from iotune.train.preflight import Refused

    items = spec.presets()
    aios = {it.volume: load_aio(spec.aio_config_for(it.volume)) for it in items}
    done = finished(out)
    weights = {it.name: weight(it.preset, _est(it.preset, aios[it.volume][0])) for it in items}
    timed: list[tuple[float, float]] = []
    t0 = time.monotonic()
    for i, it in enumerate(items, 1):
        p = it.preset
        if it.name in done:
            continue
        aio, aio_source = aios[it.volume]
        vol = spec.volume(it.volume)
        tag = {"run": it.name, "volume": vol.to_json() if vol else None}
        nvme = nvme_path_for(p, spec, it.volume)
        for note in clear_in_flight(out, p, nvme, it.name):
            if progress:
                progress.line(f"iotune: {note}")
        if progress:
            counts = {
                s: sum(r["status"] == s for r in done.values()) for s in ("ok", "failed", "skipped")
            }
            left = [weights[x.name] for x in items if x.name not in done]
            progress.header(
                f"run {i}/{len(items)}: {it.name} ({counts['ok']} done, {counts['failed']} "
                f"failed, {counts['skipped']} skipped; {_fmt_s(time.monotonic() - t0)} elapsed, "
                f"{_eta_text(eta(timed, left))})"
            )
        req = RunRequest(
            preset=p,
            out=out / "runs" / it.name,
            backend=spec.backend,
            nvme_paths=[nvme] if nvme else [],
            aio=aio,
            aio_source=aio_source,
            quiet_stdout=True,
            progress=progress is not None,
            gpu=gpu,
            launch=Launch(ranks=p.ranks) if p.ranks > 1 else None,
        )
        try:
            prep = tr.prepare(req)
        except (Refused, UsageError) as exc:
            reason = exc.message + (f" ({exc.hint})" if exc.hint else "")
            r = {**rec.skipped(p, reason, _est(p, aio)), **tag}
            _append(out, done, r, progress, f"{it.name}: skipped: {exc.message}")
            continue
        req.bandwidth, req.adam, _ = measured_inputs(
            p, prep.cfg, spec.aio_config_for(it.volume), spec.threads_config, None
        )
        req.baseline = _baseline(p, done)
        started = time.monotonic()
        try:
            result = tr.run(req, prep)
        except IotuneError as exc:
            r = {**rec.skipped(p, exc.message, prep.est), "status": "failed", **tag}
            r["run_dir"] = str(req.out)
            _name_faults(r, vol)
            _append(out, done, r, progress, f"{it.name}: failed: {exc.message}")
            continue
        if result["interrupted"]:
            raise StudyInterrupted(
                f"study interrupted ({result['interrupted']}) during {it.name}; "
                f"{len(done)} run(s) recorded",
                hint=f"iotune study --resume {out} redoes {it.name} and goes on",
            )
        r = {**rec.summarize_run(result, load_trace(req.out), str(req.out)), **tag}
        if r["status"] == "failed":
            _name_faults(r, vol)
        timed.append((weights[it.name], time.monotonic() - started))
        _append(out, done, r, progress, _one_line(r))
    return [done[it.name] for it in items if it.name in done]


def _name_faults(r: dict[str, Any], vol: Volume | None) -> None:
    """A failed run on a volume whose drives are failing says which (the drive, not the
    training, is what the next runs on that volume will meet)."""
    if vol is None:
        return
    from iotune.probes.sysfs import SysTree

    faults = member_faults(SysTree("/"), vol)
    if faults:
        r["faults"] = faults
        r["error"] = f"{r['error']}; {'; '.join(faults)}"


def _append(
    out: Path,
    done: dict[str, dict[str, Any]],
    r: dict[str, Any],
    progress: Progress | None,
    say: str,
) -> None:
    append_record(out / RUNS, r)
    done[run_name(r)] = r
    if progress:
        progress.line(f"iotune: {say}")


def _one_line(r: dict[str, Any]) -> str:
    m, e = r["measured"], r["estimate"]
    if r["status"] != "ok":
        return f"{run_name(r)}: {r['status']}: {r['error']}"
    io = ""
    if m.get("read_gib") is not None:
        io = (
            f", per step read {m['read_gib']:.2f} / write {m['write_gib']:.2f} GiB "
            f"(estimate {e['read_gib']:.2f} / {e['write_gib']:.2f})"
        )
    return (
        f"{run_name(r)}: step {m['step_s'] or 0:.2f} s, optimizer {m['optimizer_s'] or 0:.2f} s{io}"
    )


def plan(items: list[Item], spec: StudySpec, gpu: Gpus | None) -> list[dict[str, Any]]:
    """Each run with its estimate and whether it fits this host now (and why not)."""
    import tempfile

    from iotune.records import load_aio
    from iotune.train import runner as tr
    from iotune.train.preflight import Refused

    rows = []
    with tempfile.TemporaryDirectory(prefix="iotune-plan-") as tmp:
        for it in items:
            p = it.preset
            aio, _ = load_aio(spec.aio_config_for(it.volume))
            req = RunRequest(
                preset=p,
                out=Path(tmp) / it.name,
                backend=spec.backend,
                nvme_paths=[x] if (x := nvme_path_for(p, spec, it.volume)) else [],
                aio=aio,
                gpu=gpu,
            )
            reason = None
            try:
                tr.prepare(req)
            except (Refused, UsageError) as exc:
                reason = exc.message
            rows.append(plan_row(it, _est(p, aio), reason))
    return rows
