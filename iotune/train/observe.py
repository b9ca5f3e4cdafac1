"""What a traced training script really ran with, from its own processes.

`iotune trace -- COMMAND` puts iotune/hook first on the command's PYTHONPATH (its
``sitecustomize`` runs in every Python process the command starts, whatever launched it)
and names a folder in $IOTUNE_LEARN. Once a process builds a DeepSpeed engine, it writes
there the config DeepSpeed resolved, the world size, the micro-batch, the accumulation, the
dtype, and on rank 0 the model's parameter tensors (iotune/hook/sitecustomize.py), then waits
for this side's ``.go``. The :class:`Observer` here reads each file as it appears, starts the
swap folder's step watch where the run's swap files go (before DeepSpeed's first write
there), and answers. When the trace ends, :func:`learned_estimate` builds the preset and the
estimate from what the run said, through the same code as ``--model``/``--ds-config``
(iotune.model.custom), and :func:`disagreement` names in one line what the run used where
the flags said otherwise: the run's figures are the ones beside its steps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iotune.errors import IotuneError

if TYPE_CHECKING:
    from iotune.model.estimate import Estimate
    from iotune.model.presets import Preset
    from iotune.train.swapwatch import StepWatch

#: the folder a traced command's processes write to (iotune/hook/sitecustomize.py: ENV)
HOOK_ENV = "IOTUNE_LEARN"
#: how often the folder is looked at where inotify cannot watch it
POLL_S = 0.02
#: the preset's name where the run's own figures are used
RUN_NAME = "the run's own"


def hook_dir() -> Path:
    """The folder holding iotune's sitecustomize (a package of its own: iotune/hook)."""
    return Path(__file__).resolve().parent.parent / "hook"


def hook_env(learn: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment additions: the hook first on PYTHONPATH (the user's own
    entries kept after it) and the folder it writes to."""
    old = (os.environ if environ is None else environ).get("PYTHONPATH")
    path = str(hook_dir()) + (os.pathsep + old if old else "")
    return {"PYTHONPATH": path, HOOK_ENV: str(learn)}


@dataclass(frozen=True)
class SwapSite:
    """Where a run's state files are written, as the step watch needs it."""

    nvme_path: Path
    optimizer: bool  # the optimizer state's files are counted (else the parameters')
    ranks: int  # ranks writing there on this host


def swap_site(doc: Mapping[str, Any]) -> SwapSite | None:
    """The swap folder a process's report names, relative paths taken from its working
    folder as DeepSpeed takes them; None where nothing is swapped to NVMe. The optimizer
    state is swapped only in ZeRO stage 3 (stages 1 and 2 keep an "nvme" one in RAM)."""
    cwd = Path(str(doc.get("cwd") or "."))
    ranks = int(doc.get("local_world_size") or doc.get("world_size") or 1)
    if (
        doc.get("offload_optimizer") == "nvme"
        and doc.get("optimizer_nvme_path")
        and int(doc.get("zero_stage", 3)) == 3
    ):
        return SwapSite(cwd / str(doc["optimizer_nvme_path"]), True, ranks)
    if doc.get("offload_param") == "nvme" and doc.get("param_nvme_path"):
        return SwapSite(cwd / str(doc["param_nvme_path"]), False, ranks)
    return None


def _reports(learn: Path) -> list[Path]:
    try:
        entries = sorted(os.scandir(learn), key=lambda e: e.name)
    except OSError:
        return []
    return [
        Path(e.path)
        for e in entries
        if e.name.endswith(".json") and e.name.startswith(("engine-rank", "init-rank"))
    ]


class Observer:
    """Reads the run's reports as they come and keeps the step watch where they say.

    *site* (from --model/--ds-config) starts a watch at once; a report that names another
    swap folder moves it there, before that folder's first write: the process that wrote
    the report waits for this side's answer (``NAME.go``) until then."""

    def __init__(
        self,
        learn: Path,
        events: Path,
        *,
        site: SwapSite | None = None,
        on_event: Callable[[], None] | None = None,
    ) -> None:
        self.learn = learn
        self.events = events
        self.on_event = on_event
        self.site: SwapSite | None = None
        self.watch: StepWatch | None = None
        self.failed: str | None = None  # why a watch could not start
        self.shm_removed: list[Path] = []  # the run's DeepSpeed workspaces removed at its end
        self._first = site
        self._handled: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="iotune-observe", daemon=True)

    def __enter__(self) -> Observer:
        shutil.rmtree(self.learn, ignore_errors=True)  # an earlier trace's, in a reused --out
        self.learn.mkdir(parents=True)
        if self._first is not None:
            self._start(self._first)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.scan()
        if self.watch is not None:
            self.watch.__exit__(None, None, None)
        self.shm_removed = remove_run_workspaces(self.learn)

    # the step watch's findings, or none where no watch ran
    @property
    def inited(self) -> bool:
        return self.watch.inited if self.watch is not None else False

    @property
    def late_cuts(self) -> int:
        return self.watch.late_cuts if self.watch is not None else 0

    @property
    def overflowed(self) -> bool:
        return self.watch.overflowed if self.watch is not None else False

    def _loop(self) -> None:
        from iotune.trace.wake import Inotify
        from iotune.train.swapwatch import WATCH_MASK

        # woken by the kernel as a report is renamed into place (the hook writes each whole,
        # then renames it), so an idle trace costs nothing; a look every second regardless
        ino: Inotify | None = None
        try:
            made = Inotify()
            if made.add(self.learn, WATCH_MASK) is None:
                made.close()
            else:
                ino = made
        except IotuneError:
            pass  # looked at every POLL_S instead
        try:
            while not self._stop.is_set():
                if ino is not None:
                    ino.read(1.0)
                else:
                    self._stop.wait(POLL_S)
                self.scan()
        finally:
            if ino is not None:
                ino.close()

    def scan(self) -> None:
        """Handle every report not yet handled, and answer each."""
        with self._lock:
            for path in _reports(self.learn):
                if path.name in self._handled:
                    continue
                self._handled.add(path.name)
                try:
                    doc = json.loads(path.read_text())
                    site = swap_site(doc) if isinstance(doc, dict) else None
                    if site is not None and site != self.site:
                        self._start(site)
                except (OSError, ValueError) as exc:
                    self.failed = f"{path.name}: {exc}"
                except IotuneError as exc:
                    self.failed = exc.message
                finally:
                    path.with_suffix(".go").touch()

    def _start(self, site: SwapSite) -> None:
        from iotune.train.swapwatch import StepWatch

        if self.watch is not None:
            self.watch.__exit__(None, None, None)
            self.watch = None
        watch = StepWatch(
            site.nvme_path,
            self.events,
            optimizer=site.optimizer,
            ranks=site.ranks,
            on_event=self.on_event,
        )
        watch.__enter__()
        self.watch, self.site = watch, site


@dataclass(frozen=True)
class Learned:
    """Rank 0's report of its engine, and what every rank said."""

    doc: dict[str, Any]
    ranks: int  # reports of an engine received
    errors: tuple[str, ...]  # the hook's own failures, one line each
    folder: Path  # where the reports are, and the resolved config is written


def read_learned(learn: Path) -> tuple[Learned | None, list[str]]:
    """Rank 0's engine report (None where no engine was built, or the hook was not
    reached), and the lines the hook wrote on what it could not do."""
    errors: list[str] = []
    try:
        names = sorted(p.name for p in learn.iterdir() if p.name.startswith("error-rank"))
    except OSError:
        names = []
    for name in names:
        for line in (learn / name).read_text(errors="replace").splitlines():
            if line.strip() and line not in errors:
                errors.append(line.strip())
    engines = sorted(learn.glob("engine-rank*.json"))
    doc: dict[str, Any] | None = None
    for path in engines:
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and d.get("rank") == 0 and "config" in d:
            doc = d
    if doc is None:
        return None, errors
    return Learned(doc=doc, ranks=len(engines), errors=tuple(errors), folder=learn), errors


def _absolute_paths(cfg: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """The config with its nvme_paths as DeepSpeed used them: a relative one is under the
    process's working folder."""
    out: dict[str, Any] = json.loads(json.dumps(cfg))
    zo = out.get("zero_optimization")
    if isinstance(zo, dict):
        for sec in ("offload_optimizer", "offload_param"):
            off = zo.get(sec)
            if isinstance(off, dict) and isinstance(off.get("nvme_path"), str):
                off["nvme_path"] = str(cwd / off["nvme_path"])
    return out


def learned_estimate(learned: Learned) -> tuple[Preset, Estimate]:
    """The preset and estimate of what the run ran with, through --model/--ds-config's
    own code: the config DeepSpeed resolved (written beside the reports, ds_config.json, checked by
    DeepSpeed's config classes as any --ds-config is), the model's own tensors, and the
    run's micro-batch, accumulation, world size and dtype."""
    from iotune.model.custom import custom_preset, geometry_of
    from iotune.model.dsconfig import ds_config
    from iotune.model.estimate import estimate

    doc = learned.doc
    argv = doc.get("argv") or ["the script"]
    cfg_path = learned.folder / "ds_config.json"
    cfg_path.write_text(
        json.dumps(_absolute_paths(doc["config"], Path(str(doc.get("cwd") or "."))), indent=2)
    )
    model = doc["model"]
    if not model.get("tensors"):
        raise IotuneError(
            "the run's model has no parameters", hint="DeepSpeed was given an empty model"
        )
    source = f"{Path(str(argv[0])).name}'s model"
    sets = [f"dtype={doc['dtype']}"] if doc.get("dtype") in ("bf16", "fp32") else []
    if doc.get("accelerator") in ("cpu", "cuda"):
        sets.append(f"accelerator={doc['accelerator']}")
    p = custom_preset(
        source,
        str(cfg_path),
        micro_batch=int(doc["micro_batch"]),
        ga=int(doc["ga"]),
        ranks=int(doc["world_size"]),
        sets=tuple(sets),
        geometry=geometry_of(model, source),
        name=RUN_NAME,
    )
    return p, estimate(p, ds_config(p))


#: the config keys a disagreement is looked for in, with DeepSpeed's default where absent
COMPARED_KEYS: tuple[tuple[str, Any], ...] = (
    ("zero_optimization.stage", 0),
    ("zero_optimization.offload_optimizer.device", "none"),
    ("zero_optimization.offload_optimizer.nvme_path", None),
    ("zero_optimization.offload_param.device", "none"),
    ("zero_optimization.offload_param.nvme_path", None),
    ("zero_optimization.sub_group_size", 1e9),
    ("zero_optimization.offload_optimizer.buffer_count", 4),
    ("zero_optimization.offload_param.buffer_count", 5),
    ("zero_optimization.offload_param.buffer_size", 1e8),
    ("aio.block_size", 1 << 20),
)


def _get(cfg: Mapping[str, Any], dotted: str, default: Any) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return default if node is None else node


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, str) and isinstance(b, str) and a.startswith("/") and b.startswith("/"):
        return os.path.normpath(a) == os.path.normpath(b)
    return str(a).lower() == str(b).lower()


def _show(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"


def differences(
    told: Preset, told_est: Estimate, run: Preset, run_est: Estimate
) -> list[tuple[str, str, str]]:
    """(what, the run's, iotune was told) for each figure of the I/O model where the run
    and the flags part."""
    out: list[tuple[str, str, str]] = []
    pairs: list[tuple[str, Any, Any]] = [
        ("N", run_est.params, told_est.params),
        ("world size", run.ranks, told.ranks),
        ("micro-batch", run.micro_batch, told.micro_batch),
        ("gradient accumulation", run.ga, told.ga),
        ("dtype", run.dtype, told.dtype),
    ]
    for key, default in COMPARED_KEYS:
        pairs.append((key, _get(run.deepspeed, key, default), _get(told.deepspeed, key, default)))
    for what, mine, theirs in pairs:
        if not _same(mine, theirs):
            out.append((what, _show(mine), _show(theirs)))
    return out


def disagreement(diffs: list[tuple[str, str, str]]) -> str | None:
    """One line naming every figure where the run used another value than iotune was told
    (--model, --ds-config, the batch options, --set), or None where they agree."""
    if not diffs:
        return None
    parts = ", ".join(f"{what} {mine} (told {theirs})" for what, mine, theirs in diffs)
    return (
        f"the run's own figures differ from what iotune was told: {parts}; the estimate "
        "beside the steps is the run's"
    )


def remove_run_workspaces(learn: Path, shm: Path = Path("/dev/shm")) -> list[Path]:  # noqa: S108
    """DeepSpeed's CPU allreduce workspaces (66 MiB each in /dev/shm, which its ranks leave
    behind) of the traced run, by the port its ranks reported; the run has ended."""
    from iotune.workers.launch import remove_workspaces

    ports = set()
    for path in learn.glob("engine-rank*.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            port = json.loads(path.read_text()).get("master_port")
            if isinstance(port, str) and port.isdigit():
                ports.add(port)
    return [f for port in sorted(ports) for f in remove_workspaces(port, shm)]
