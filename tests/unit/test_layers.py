"""The package's rooms and the one way their imports run (docs/design.md, "Rooms";
scripts/rooms.py prints them): every import of an iotune module, at the top of a file or
inside a function, goes to its own room or to one below it; no two modules import each other,
directly or round a circle; no module passes 450 lines; and the benchmarks and scripts use the
layer that does the work, never a private name of iotune's (one that begins with "_") nor its
command line. Read from the source with ast: nothing is imported to check it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(TOP / "scripts"))
import rooms  # type: ignore[import-not-found]  # noqa: E402


def test_imports_run_down_only_with_no_circle_and_no_module_above_450_lines() -> None:
    assert {rooms.room(m) for m in rooms.modules()} - set(rooms.APART) <= set(rooms.ROOMS)
    found = rooms.faults()
    assert not found, "\n".join(found)


def test_each_rooms_docstring_says_what_it_may_import() -> None:
    rooms_ = sorted(p.parent.name for p in (TOP / "iotune").glob("*/__init__.py"))
    silent = [
        r for r in rooms_ if "May import" not in (TOP / "iotune" / r / "__init__.py").read_text()
    ]
    assert len(rooms_) >= 14 and not silent, silent


def test_no_room_holds_more_than_a_fifth_of_the_package() -> None:
    big = {r["room"]: r["share"] for r in rooms.table() if float(r["share"]) > 20.0}  # type: ignore[arg-type]
    assert not big, big


@pytest.mark.parametrize("folder", ["benchmarks", "scripts"])
def test_benchmarks_and_scripts_use_the_working_layer_not_private_names(folder: str) -> None:
    known = rooms.modules()
    bad = []
    for f in sorted((TOP / folder).rglob("*.py")):
        for line, target, name in rooms.imported(f, known):
            where = f"{f.relative_to(TOP)}:{line}"
            if any(p.startswith("_") for p in [*target.split("."), name] if p != "__init__"):
                bad.append(f"{where} imports a private name: {target} {name}".rstrip())
            if rooms.room(target) == "cli":
                bad.append(f"{where} imports the command line ({target}): use its layer")
    assert not bad, "\n".join(bad)


def test_the_check_finds_an_arrow_up_a_circle_a_long_module_and_a_private_name(
    tmp_path: Path,
) -> None:
    """The check on a made-up package: each fault is found (a check that cannot fail is no
    check)."""
    pkg = tmp_path / "iotune"
    for d in ("model", "plan", "cli"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "plan" / "drives.py").write_text("from iotune.model import x\n")
    (pkg / "cli" / "trace.py").write_text("def _backend():\n    pass\n")
    (pkg / "model" / "x.py").write_text(
        "from iotune.plan.drives import plan_drives\n"
        "def g():\n    from iotune.cli.trace import _backend\n"
        "from . import y\n" + "\n" * 451
    )
    (pkg / "model" / "y.py").write_text("")
    known = rooms.modules(tmp_path)
    assert sorted(rooms.imported(pkg / "model" / "x.py", known, tmp_path)) == [
        (1, "iotune.plan.drives", "plan_drives"),
        (3, "iotune.cli.trace", "_backend"),
        (4, "iotune.model.y", ""),
    ]
    assert rooms.faults(tmp_path) == [
        "iotune/model/x.py:1: model imports iotune.plan.drives (above it)",
        "iotune/model/x.py:3: model imports iotune.cli.trace (above it)",
        "iotune.model.x -> iotune.plan.drives -> iotune.model.x: a circle",
        "iotune/model/x.py: 455 lines (at most 450)",
    ]
