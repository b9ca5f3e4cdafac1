"""The study's grid as presets, and the cost weights its ETA is made from. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from iotune.errors import UsageError
from iotune.model.estimate import Estimate
from iotune.model.presets import (
    Preset,
    apply_sets,
    base_name,
    get_preset,
    load_presets,
    parse_sets,
)


@dataclass(frozen=True)
class Item:
    """One run of the study: the preset as it will run (name includes the accumulation)."""

    preset: Preset
    volume: str | None = None  # --volume NAME the run offloads to (None: the study's path)

    @property
    def name(self) -> str:
        """The run's name in the study: the preset, @ its volume where volumes are an axis."""
        return self.preset.name + (f"@{self.volume}" if self.volume else "")


def grid_values(presets: dict[str, Preset]) -> tuple[list[str], list[str], list[int]]:
    """Sizes, strategies and accumulations of the study's grid, in the presets file's order."""
    sizes: list[str] = []
    strategies: list[str] = []
    gas: list[int] = []
    for p in presets.values():
        if p.size == "tiny":
            continue
        for seq, v in ((sizes, p.size), (strategies, p.strategy.name), (gas, p.ga)):
            if v not in seq:
                seq.append(v)  # type: ignore[arg-type]
    return sizes, strategies, gas


def with_ga(p: Preset, ga: int) -> Preset:
    """``p`` at accumulation ``ga``, named as the grid names it (NAME_gaN)."""
    if ga == p.ga:
        return p
    base = base_name(p.name)
    return replace(apply_sets(p, {"ga": ga}), name=base if ga == 1 else f"{base}_ga{ga}")


def expand(
    sizes: list[str] | None,
    strategies: list[str] | None,
    gas: list[int] | None,
    names: list[str] | None,
    steps: int | None,
    sets: tuple[str, ...] = (),
) -> list[Item]:
    """The runs, in order: strategy-major within each size (RAM before NVMe, as the presets
    file lists them, so a baseline has run before the runs that use it), accumulation inner."""
    presets = load_presets()
    all_sizes, all_strats, all_gas = grid_values(presets)
    if names:
        if sizes or strategies:
            raise UsageError(
                "--presets names the runs: drop --sizes and --strategies",
                hint="iotune study --presets tiny_opt_ram,tiny_opt_nvme --ga 1,2",
            )
        bases = [get_preset(n) for n in names]
    else:
        for what, given, known in (
            ("--sizes", sizes, all_sizes),
            ("--strategies", strategies, all_strats),
        ):
            bad = [v for v in given or [] if v not in known]
            if bad:
                raise UsageError(
                    f"{what}: {', '.join(bad)} is not in the study's grid",
                    hint=f"{what} {','.join(known)}",
                )
        sz = sizes or ["1b"]
        st = strategies or all_strats
        bases = [presets[f"{s}_{z}"] for z in sz for s in all_strats if s in st]
    overrides = parse_sets(sets)
    owned = sorted(set(overrides) & {"ga", "steps"})
    if owned:
        raise UsageError(
            f"--set {owned[0]}=... : the study's runs take it from --{owned[0]}",
            hint=f"iotune study ... --{owned[0]} {overrides[owned[0]]}",
        )
    items = []
    for base in bases:
        for ga in gas or ([base.ga] if names else all_gas):
            p = apply_sets(with_ga(base, ga), overrides)
            if steps is not None:
                p = replace(p, steps=steps)
            items.append(Item(p))
    seen = set()
    for it in items:
        if it.name in seen:
            raise UsageError(f"{it.name} is in the study twice", hint="name each preset once")
        seen.add(it.name)
    return items


def weight(p: Preset, est: Estimate) -> float:
    """A run's relative cost, for the ETA: bytes the drives move over all steps plus the
    optimizer's work (16 bytes per parameter per step) and forward/backward per token.
    Only ratios between runs matter; seconds per unit come from the runs so far."""
    io = est.init_first.read + est.init_first.write
    io += max(0, p.steps - 1) * (est.steady_step.read + est.steady_step.write)
    compute = p.steps * (16 * est.params + 6 * est.params * p.tokens_per_step / 1000)
    return float(io + compute)


def eta(done: list[tuple[float, float]], remaining: list[float]) -> float | None:
    """Seconds left: the remaining runs' weights at the seconds per weight of the runs done
    (weight, seconds); None before the first run finishes."""
    w = sum(x for x, _ in done)
    if not done or w <= 0:
        return None
    return sum(remaining) * sum(s for _, s in done) / w


def plan_row(item: Item, est: Estimate | None, reason: str | None) -> dict[str, Any]:
    p = item.preset
    return {
        "preset": p.name,
        "run": item.name,
        "volume": item.volume,
        "size": p.size,
        "strategy": p.strategy.name,
        "ga": p.ga,
        "steps": p.steps,
        "accelerator": p.accelerator,
        "nvme_bytes": est.nvme_bytes if est else None,
        "read_bytes_step": est.steady_step.read if est else None,
        "write_bytes_step": est.steady_step.write if est else None,
        "host_bytes": est.host_bytes if est else None,
        "gpu_bytes": est.gpu_bytes if est else None,
        "fits": reason is None,
        "reason": reason,
    }
