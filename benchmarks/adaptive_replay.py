"""How often the adaptive search chooses as well as the full grid, over many draws of the
measurement noise, on a bandwidth surface fitted to a recorded grid.

    .venv/bin/python benchmarks/adaptive_replay.py RUN [RUN ...] [--draws 1000]
                                                    [--variant FINALISTS:ROUNDS:SHARE ...]

RUN: a directory `benchmarks/sweep_aio.py --keep` wrote (or its records.tgz). The first with
grid/points.jsonl gives the grid; adaptive-*/points.jsonl of every RUN give the noise between
runs.

- The surface: per op, log bandwidth fitted by the five settings' main effects and pairwise
  interactions (least squares) to the grid's medians. The medians carry the noise of their
  measurement; the fit keeps their structure (its residual is printed beside the noise).
- The noise: per repeat, from the spread of each grid point's repeats; per point (shared by
  its repeats: what drifts between points), from how an adaptive run's median of a
  configuration differs from the grid's, less the repeats' part.
- Each draw measures the grid once and runs each strategy (the real generators of
  iotune.sweep.space and its best_per_op) with fresh noise on the same surface, and
  compares the *surface's* bandwidth at their choices. A choice compared with the grid's
  measured best (the largest of many noisy medians, biased upward) looks worse than it is;
  this comparison is fair. A second grid is the baseline: how often the grid agrees with
  itself.

What it leaves out: noise that drifts over a run (each point's is drawn on its own, so the
race's measuring its finalists side by side gains nothing here that it would not on a
drive), and any structure of the surface beyond pairs of settings (which a search one
setting at a time would find harder). The fit also takes up part of the noise of the
medians it is fitted to (38 parameters per op on 90 configurations).
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from iotune.records import read_records
from iotune.sweep import space as sp
from iotune.sweep.space import COORDS, Space, best_per_op, config_of

Cfg = tuple[int, int, int, bool, bool]
Surface = dict[tuple[str, Cfg], float]


def load(path: Path) -> list[dict[str, Any]]:
    return [r for r in read_records(path) if r.get("status") == "ok"]


def unpack(run: Path, tmp: Path) -> Path:
    """A RUN directory as it is, or a records.tgz unpacked (its records/ directory)."""
    if run.is_file():
        out = tmp / f"run{len(list(tmp.iterdir()))}"
        with tarfile.open(run) as t:
            t.extractall(out, filter="data")
        return out / "records"
    return run


def fit(grid: Sequence[dict[str, Any]]) -> tuple[Surface, dict[str, float]]:
    """The fitted surface and, per op, the fit's residual (log) standard deviation."""
    surface: Surface = {}
    residual: dict[str, float] = {}
    for op in sorted({r["op"] for r in grid}):
        rs = [r for r in grid if r["op"] == op]
        cfgs = [config_of(r) for r in rs]
        levels = [sorted({c[i] for c in cfgs}) for i in range(len(COORDS))]
        varied = [i for i in range(len(COORDS)) if len(levels[i]) > 1]

        def features(
            c: Cfg, levels: list[list[Any]] = levels, varied: list[int] = varied
        ) -> list[float]:
            hot = {i: [1.0 if c[i] == v else 0.0 for v in levels[i][1:]] for i in varied}
            f = [1.0, *(x for i in varied for x in hot[i])]
            for i, j in itertools.combinations(varied, 2):
                f += [a * b for a in hot[i] for b in hot[j]]
            return f

        x = np.array([features(c) for c in cfgs])
        y = np.log([r["bw_bytes_s"] for r in rs])
        beta, *_ = np.linalg.lstsq(x, y, rcond=None)
        res = y - x @ beta
        residual[op] = float(np.sqrt((res**2).sum() / max(len(y) - x.shape[1], 1)))
        for c, v in zip(cfgs, x @ beta, strict=True):
            surface[(op, c)] = float(math.exp(v))
    return surface, residual


def noise(
    grid: Sequence[dict[str, Any]], adaptive: Sequence[dict[str, Any]]
) -> tuple[float, float]:
    """(per repeat, per point) log standard deviations: the repeats' pooled variance within
    the grid's points; the point's part from how an adaptive run's median differs from the
    grid's for the same configuration, less what the repeats put into both medians."""
    within = [
        (statistics.variance(logs), len(logs) - 1)
        for r in grid
        if len(logs := [math.log(v) for v in r.get("bw_bytes_s_all") or []]) > 1
    ]
    dof = sum(d for _, d in within)
    per_repeat = math.sqrt(sum(v * d for v, d in within) / dof) if dof else 0.0
    med = {(r["op"], config_of(r)): r for r in grid}
    diffs, repeat_part = [], []
    for r in adaptive:
        g = med.get((r["op"], config_of(r)))
        if g is None or r.get("phase", "sweep") != "sweep":
            continue
        diffs.append(math.log(r["bw_bytes_s"] / g["bw_bytes_s"]))
        # a median of k repeats carries about per_repeat^2 / k of their variance
        ks = (len(x.get("bw_bytes_s_all") or [0]) for x in (r, g))
        repeat_part.append(sum(per_repeat**2 / k for k in ks))
    if len(diffs) < 2:
        return per_repeat, 0.0
    point_var = (statistics.pvariance(diffs) - statistics.fmean(repeat_part)) / 2
    return per_repeat, math.sqrt(max(point_var, 0.0))


def records_of(
    strategy: sp.Strategy, measure: Callable[[sp.Point], dict[str, Any]]
) -> list[dict[str, Any]]:
    """The records of *strategy* run to its end with each point measured by *measure*."""
    records: list[dict[str, Any]] = []

    def batch(points: list[sp.Point]) -> dict[str, float | None]:
        recs = [measure(p) for p in points]
        records.extend(recs)
        return {p.key(): r["bw_bytes_s"] for p, r in zip(points, recs, strict=True)}

    sp.drive(strategy, batch)
    return records


def variant_spec(text: str) -> tuple[int, int, float]:
    """--variant FINALISTS:ROUNDS:SHARE, e.g. 4:3:0.25."""
    try:
        f, r, s = text.split(":")
        out = int(f), int(r), float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: want FINALISTS:ROUNDS:SHARE, e.g. 4:3:0.25"
        ) from None
    if out[0] < 1 or out[1] < 1 or not 0 < out[2] <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: FINALISTS, ROUNDS >= 1; 0 < SHARE <= 1")
    return out


def variant(space: Space, repeats: int, spec: tuple[int, int, float]) -> Callable[[], sp.Strategy]:
    """An adaptive search with FINALISTS, ROUNDS and SHARE instead of its defaults."""
    f, r, s = spec
    return lambda: sp.adaptive(space, repeats, finalists=f, rounds=r, share=s)


def quantile(xs: Sequence[float], q: float) -> float:
    """The q-th quantile (0 < q < 1) by linear interpolation between order statistics."""
    return statistics.quantiles(xs, n=1000, method="inclusive")[round(q * 1000) - 1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2, help="repeats per point, as the runs")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        type=variant_spec,
        help="FINALISTS:ROUNDS:SHARE, an adaptive search with other settings",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        missing = [str(r) for r in args.runs if not r.exists()]
        if missing:
            ap.error(f"no such RUN: {', '.join(missing)}")
        runs = [unpack(r, Path(tmpdir)) for r in args.runs]
        with_grid = [i for i, r in enumerate(runs) if (r / "grid" / "points.jsonl").exists()]
        if not with_grid:
            raise SystemExit("no RUN has grid/points.jsonl")
        grid_dir = runs[with_grid[0]]
        grid = load(grid_dir / "grid" / "points.jsonl")
        adaptive = [
            rec for r in runs for p in sorted(r.glob("adaptive-*/points.jsonl")) for rec in load(p)
        ]
    surface, residual = fit(grid)
    per_repeat, per_point = noise(grid, adaptive)
    ops = tuple(sorted({op for op, _ in surface}))
    values = {c: tuple(sorted({cfg[i] for _, cfg in surface})) for i, c in enumerate(COORDS)}
    space = Space(ops=ops, **values)  # type: ignore[arg-type]
    print(
        f"grid: {args.runs[with_grid[0]]}; {len(surface) // len(ops)} configurations per op; "
        f"fit residual {', '.join(f'{op} {v:.3f}' for op, v in residual.items())} (log sd)"
    )
    print(
        f"noise (log sd): {per_repeat:.3f} per repeat, {per_point:.3f} per point "
        f"(from {len(adaptive)} adaptive records); {args.draws} draws, {args.repeats} repeats"
    )
    strategies: dict[str, Callable[[], sp.Strategy]] = {
        "second grid": lambda: sp.grid(space, args.repeats),
        f"adaptive ({sp.FINALISTS}:{sp.RACE_ROUNDS}:{sp.ADAPTIVE_SHARE})": lambda: sp.adaptive(
            space, args.repeats
        ),
    }
    for v in args.variant:
        strategies[f"adaptive ({v[0]}:{v[1]}:{v[2]})"] = variant(space, args.repeats, v)
    top = {op: max(v for (o, _), v in surface.items() if o == op) for op in ops}
    ratio: dict[str, dict[str, list[float]]] = {n: {op: [] for op in ops} for n in strategies}
    of_top: dict[str, dict[str, list[float]]] = {
        n: {op: [] for op in ops} for n in ["grid", *strategies]
    }
    points: dict[str, list[int]] = {n: [] for n in strategies}
    for draw in range(args.draws):
        rng = random.Random(draw)  # noqa: S311 - a seeded draw, not a secret

        def measure(p: sp.Point, rng: random.Random = rng) -> dict[str, Any]:
            true = surface[(p.op, p.config())] * math.exp(rng.gauss(0.0, per_point))
            xs = [true * math.exp(rng.gauss(0.0, per_repeat)) for _ in range(p.repeats)]
            return {
                **p.as_dict(),
                "status": "ok",
                "bw_bytes_s": statistics.median(xs),
                "bw_bytes_s_all": xs,
            }

        base = best_per_op(records_of(sp.grid(space, args.repeats), measure))
        for op in ops:
            of_top["grid"][op].append(surface[(op, config_of(base[op]))] / top[op])
        for name, make in strategies.items():
            recs = records_of(make(), measure)
            points[name].append(len(recs))
            best = best_per_op(recs)
            for op in ops:
                chosen = surface[(op, config_of(best[op]))]
                ratio[name][op].append(chosen / surface[(op, config_of(base[op]))])
                of_top[name][op].append(chosen / top[op])
    n_grid = space.size()
    print(
        "\nthe surface's bandwidth at a strategy's choice / at the grid's choice "
        "(median, 10th percentile, share of draws at 0.97 or more); its choice / the "
        "surface's best (median)"
    )
    for name in strategies:
        pts = points[name]
        print(
            f"{name:<24} points {statistics.median(pts):.0f} of {n_grid} "
            f"({statistics.median(pts) / n_grid:.0%}; {quantile(pts, 0.1) / n_grid:.0%}.."
            f"{quantile(pts, 0.9) / n_grid:.0%})"
        )
        for op in ops:
            xs = ratio[name][op]
            print(
                f"   {op:<5} median {statistics.median(xs):.3f}  p10 {quantile(xs, 0.1):.3f}  "
                f">=0.97 in {sum(x >= 0.97 for x in xs) / len(xs):.0%}  "
                f"(of the best {statistics.median(of_top[name][op]):.3f}; the grid's "
                f"{statistics.median(of_top['grid'][op]):.3f})"
            )


if __name__ == "__main__":
    main()
