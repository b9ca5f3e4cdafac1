"""The package's rooms and the one way their imports run (docs/design.md, "Rooms"): every
import of an iotune module, at the top of a file or inside a function, goes to its own room or
to one below it; no two modules import each other, directly or round a circle; no module
passes 450 lines; and the benchmarks and scripts use the layer that does the work, never a
private name of iotune's (one that begins with "_") nor its command line.

Read from the source with ast, as a reader would: nothing is imported to check it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]
PKG = TOP / "iotune"

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


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = f.relative_to(TOP).with_suffix("").parts
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


def graph() -> dict[str, set[str]]:
    known = modules()
    return {
        m: {t for _, t, _ in imported(f, known) if t in known and t != m}
        for m, f in known.items()
        if room(m) not in APART
    }


def test_every_room_is_named_and_imports_run_down_only() -> None:
    known = modules()
    rooms = {room(m) for m in known} - set(APART)
    assert rooms <= set(ROOMS), f"rooms not in the order: {sorted(rooms - set(ROOMS))}"
    up = []
    for m, f in known.items():
        if room(m) in APART:
            continue
        here = ROOMS.index(room(m))
        for line, target, _ in imported(f, known):
            if room(target) in APART:
                up.append(f"{f.relative_to(TOP)}:{line} imports {target}, which is apart")
            elif ROOMS.index(room(target)) < here:
                up.append(f"{f.relative_to(TOP)}:{line}: {room(m)} imports {target} (above it)")
    assert not up, "\n".join(up)


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


def test_no_circle_between_modules() -> None:
    found = circles(graph())
    assert not found, "\n".join(" -> ".join(c) for c in found)


def test_no_module_above_450_lines() -> None:
    long = {
        str(f.relative_to(TOP)): n
        for f in PKG.rglob("*.py")
        if (n := len(f.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


@pytest.mark.parametrize("folder", ["benchmarks", "scripts"])
def test_benchmarks_and_scripts_use_the_working_layer_not_private_names(folder: str) -> None:
    known = modules()
    bad = []
    for f in sorted((TOP / folder).rglob("*.py")):
        for line, target, name in imported(f, known):
            where = f"{f.relative_to(TOP)}:{line}"
            if any(p.startswith("_") for p in [*target.split("."), name] if p != "__init__"):
                bad.append(f"{where} imports a private name: {target} {name}".rstrip())
            if room(target) == "cli":
                bad.append(f"{where} imports the command line ({target}): use its layer")
    assert not bad, "\n".join(bad)


def test_the_check_sees_an_arrow_up_a_circle_and_a_private_name(tmp_path: Path) -> None:
    """The check's own parts on a made-up file and graph: each fault is found (a check that
    cannot fail is no check)."""
    f = tmp_path / "iotune" / "model" / "x.py"
    f.parent.mkdir(parents=True)
    f.write_text(
        "from iotune.plan.drives import plan_drives\n"
        "def g():\n    from iotune.cli.trace import _backend\n"
        "from . import estimate\n"
    )
    known = {"iotune.plan.drives": f, "iotune.cli.trace": f, "iotune.model.estimate": f}
    assert sorted(imported(f, known, tmp_path)) == [
        (1, "iotune.plan.drives", "plan_drives"),
        (3, "iotune.cli.trace", "_backend"),
        (4, "iotune.model.estimate", ""),
    ]
    # model sits below plan: its import of plan is an arrow up
    assert ROOMS.index(room("iotune.plan.drives")) < ROOMS.index(room("iotune.model.x"))
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []
