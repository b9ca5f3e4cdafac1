"""What a sweep concludes and where it keeps it: the best point per op, the best balanced
configuration, the DeepSpeed "aio" block to use, and ``RUN/result.json``, which
``iotune run --aio-config RUN`` and ``iotune estimate --aio-config RUN`` read back."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iotune.errors import IotuneError
from iotune.probes.sysfs import SysTree
from iotune.records import SWEEP_RESULT as RESULT
from iotune.records import to_jsonable
from iotune.sweep import space as sp
from iotune.sweep.config import write_config as merge_config

if TYPE_CHECKING:
    from iotune.sweep.runner import Sweep


@dataclass(frozen=True)
class Choice:
    """The sweep's picks: best record per op, best balanced configuration with its score,
    and the aio block recommended (the balanced one, else the first op's best)."""

    best: dict[str, dict[str, Any]]
    balanced: tuple[tuple[int, int, int, bool, bool], float] | None
    aio: dict[str, Any] | None


def choose(records: Sequence[dict[str, Any]], *, use_gds: bool = False) -> Choice:
    best = sp.best_per_op(records)
    bal = sp.balanced(records)
    cfg = bal[0] if bal else (sp.config_of(next(iter(best.values()))) if best else None)
    return Choice(best, bal, sp.aio_block(cfg, use_gds=use_gds) if cfg else None)


def summarize(
    run_dir: Path,
    strategy: str,
    records: Sequence[dict[str, Any]],
    *,
    use_gds: bool,
    interrupted: bool,
    budget_exhausted: bool,
    ceilings: list[dict[str, Any]],
) -> dict[str, Any]:
    """The result document (without the config merge and the path hints, added by
    :func:`finish`)."""
    ok = [r for r in records if r.get("status") == "ok"]
    c = choose(records, use_gds=use_gds)
    return {
        "out": str(run_dir.resolve()),
        "strategy": strategy,
        "points": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "interrupted": interrupted,
        "budget_exhausted": budget_exhausted,
        "best": c.best,
        "balanced": {"config": sp.aio_block(c.balanced[0]), "score": c.balanced[1]}
        if c.balanced
        else None,
        "aio": c.aio,
        "ceilings": ceilings,
        "fio_best": fio_best(c.best, ceilings),
    }


def fio_best(
    best: dict[str, dict[str, Any]], ceilings: Sequence[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per op, fio's best over the same grid, and the best AIO configuration against it."""
    out: dict[str, dict[str, Any]] = {}
    for op, r in best.items():
        mine = [c for c in ceilings if c.get("op") == op and c.get("bw_bytes_s")]
        if not mine:
            continue
        top = max(mine, key=lambda c: float(c["bw_bytes_s"]))
        out[op] = {
            "bw_bytes_s": float(top["bw_bytes_s"]),
            "block_size": top["block_size"],
            "queue_depth": top["queue_depth"],
            "jobs": top.get("jobs", 1),
            "aio_pct": 100.0 * float(r["bw_bytes_s"]) / float(top["bw_bytes_s"]),
        }
    return out


def finish(
    sweep: Sweep,
    run_dir: Path,
    records: Sequence[dict[str, Any]],
    *,
    interrupted: bool,
    write_config: str | None,
) -> dict[str, Any]:
    """Summarize, merge the aio block into --write-config (a finished sweep only), add the
    offload hints, and write ``RUN/result.json``."""
    spec = sweep.spec
    result = summarize(
        run_dir,
        spec.strategy,
        records,
        use_gds=spec.gds,
        interrupted=interrupted,
        budget_exhausted=sweep.budget_hit,
        ceilings=list(sweep.ceilings.values()),
    )
    aio = result["aio"]
    if write_config and aio and not interrupted:
        report = merge_config(Path(write_config), aio)
        result["config_written"] = {"path": write_config, "deepspeed_reads": report.get("aio_used")}
    result["nvme_path_hints"] = nvme_path_hints(SysTree("/"), Path(spec.target))
    write_result(run_dir, result)
    return result


def write_result(run_dir: Path, result: dict[str, Any]) -> None:
    (run_dir / RESULT).write_text(json.dumps(to_jsonable(result), indent=2) + "\n")


def nvme_path_hints(tree: SysTree, target: Path) -> list[str]:
    """Offload config hints when the target lives on an md RAID volume."""
    from iotune.trace.targets import resolve_path

    try:
        t = resolve_path(tree, str(target))
    except IotuneError:
        return []
    if not t.arrays:
        return []
    a = t.arrays[0]
    return [
        f"{target} is on {a.level} {a.name} ({', '.join(a.members)}): use it as "
        f'"offload_optimizer": {{"device": "nvme", "nvme_path": "{target}"}} and '
        f'"offload_param": {{"device": "nvme", "nvme_path": "{target}"}} (ZeRO stage 3)'
    ]
