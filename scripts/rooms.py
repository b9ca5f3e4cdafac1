#!/usr/bin/env python3
"""The package's rooms (its folders, and its top-level modules) and the imports between them,
read from the source with ast, as a reader would (nothing is imported): each room's lines and
share of the package, its modules, the rooms it imports, and every fault the unit tier's
check (tests/unit/test_layers.py) refuses: an import up the order below, a circle between
modules, a module above 450 lines.

    scripts/rooms.py            # the table, then the faults (exit 1 where there is one)
    scripts/rooms.py --json     # the same as one document
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]

#: the rooms, from the top floor down: a room may import only the rooms after it
ROOMS = (
    "__main__",
    "cli",
    "report",
    "study",
    "train",
    "plan",
    "doctor",
    "sweep",
    "workers",
    "model",
    "raid",
    "fabrics",
    "trace",
    "checks",
    "render",
    "records",
    "probes",
    "proc",
    "units",
    "paths",
    "errors",
    "__init__",
)
#: loaded into the traced processes of a user's script (PYTHONPATH), never imported by iotune
APART = ("hook",)
MAX_LINES = 450


def modules(top: Path = TOP) -> dict[str, Path]:
    """iotune's modules by dotted name: iotune.plan.drives -> its file."""
    out = {}
    for f in sorted((top / "iotune").rglob("*.py")):
        parts = f.relative_to(top).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def room(module: str) -> str:
    """iotune.plan.drives -> plan; iotune.units -> units; iotune -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported(f: Path, known: dict[str, Path], top: Path = TOP) -> Iterator[tuple[int, str, str]]:
    """(line, module imported, name imported) for each import of iotune in *f*: a name that is a
    module of its own counts as that module."""
    pkg = ".".join(f.relative_to(top).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(f.read_text(), str(f))):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "iotune":
                    yield node.lineno, a.name, ""
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's own package
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.split(".")[0] != "iotune":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in known:
                    yield node.lineno, sub, ""
                else:
                    yield node.lineno, base, a.name


def graph(top: Path = TOP) -> dict[str, set[str]]:
    """Module -> the iotune modules it imports (apart rooms left out)."""
    known = modules(top)
    return {
        m: {t for _, t, _ in imported(f, known, top) if t in known and t != m}
        for m, f in known.items()
        if room(m) not in APART
    }


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Each circle a depth-first walk of *g* meets, as the modules round it."""
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if state.get(t) == 1:
                found.append([*stack[stack.index(t) :], t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)
    return found


def faults(top: Path = TOP) -> list[str]:
    """Every import up the order, circle and module above MAX_LINES, one line each."""
    known = modules(top)
    out = []
    for m, f in known.items():
        if room(m) in APART:
            continue
        if room(m) not in ROOMS:
            out.append(f"{f.relative_to(top)}: room {room(m)!r} is not in the order (ROOMS)")
            continue
        here = ROOMS.index(room(m))
        for line, target, _ in imported(f, known, top):
            there = room(target)
            if there in APART:
                out.append(f"{f.relative_to(top)}:{line} imports {target}, which is apart")
            elif there in ROOMS and ROOMS.index(there) < here:
                out.append(f"{f.relative_to(top)}:{line}: {room(m)} imports {target} (above it)")
    out += [" -> ".join(c) + ": a circle" for c in circles(graph(top))]
    for f in known.values():
        n = len(f.read_text().splitlines())
        if n > MAX_LINES:
            out.append(f"{f.relative_to(top)}: {n} lines (at most {MAX_LINES})")
    return out


def table(top: Path = TOP) -> list[dict[str, object]]:
    """Each room: its lines, share of the package, modules and the rooms it imports."""
    known = modules(top)
    lines: Counter[str] = Counter()
    count: Counter[str] = Counter()
    arrows: dict[str, Counter[str]] = {}
    for m, f in known.items():
        r = room(m)
        lines[r] += len(f.read_text().splitlines())
        count[r] += 1
        for _, t, _ in imported(f, known, top):
            if room(t) != r:
                arrows.setdefault(r, Counter())[room(t)] += 1
    total = sum(lines.values())
    order = {r: i for i, r in enumerate(ROOMS)}
    return [
        {
            "room": r,
            "lines": lines[r],
            "share": round(100 * lines[r] / total, 1),
            "modules": count[r],
            "imports": dict(sorted(arrows.get(r, Counter()).items())),
        }
        for r in sorted(lines, key=lambda x: (order.get(x, len(order)), x))
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON document on stdout")
    ap.add_argument("--top", type=Path, default=TOP, help="the checkout (default: this one)")
    args = ap.parse_args()
    rows, found = table(args.top), faults(args.top)
    if args.json:
        print(json.dumps({"rooms": rows, "faults": found}, indent=2))
        return 1 if found else 0
    print(f"{'ROOM':<10} {'LINES':>6} {'SHARE':>6} {'MODULES':>7}  IMPORTS")
    for r in rows:
        imports = ", ".join(f"{k} {v}" for k, v in r["imports"].items())  # type: ignore[attr-defined]
        print(f"{r['room']:<10} {r['lines']:>6} {r['share']:>5}% {r['modules']:>7}  {imports}")
    for x in found:
        print(f"fault: {x}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
