"""The documentation's printed examples still print what they show: scripts/check_examples.py
runs every example that needs nothing but this checkout and finds its lines in order."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TOP = Path(__file__).resolve().parent.parent.parent


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_examples", TOP / "scripts" / "check_examples.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["check_examples"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_every_runnable_example_prints_what_the_docs_show() -> None:
    ce = _checker()
    exs = [
        e
        for md in (TOP / "README.md", *sorted((TOP / "docs").rglob("*.md")))
        for e in ce.examples(md)
    ]
    runnable = [e for e in exs if ce.runnable(e) is None]
    assert len(runnable) >= 7, [e.where for e in runnable]
    assert [bad for e in runnable if (bad := ce.check(e))] == []


def test_an_example_that_drifted_is_caught(tmp_path: Path) -> None:
    ce = _checker()
    md = tmp_path / "doc.md"
    md.write_text(
        "```\n$ iotune presets list --strategy opt_nvme --size 1b\n...\n"
        "opt_nvme_1b        9.99B  h2048 i8192 L16 heads 32/8 vocab 128256 tied  opt_nvme\n```\n"
    )
    (ex,) = ce.examples(md)
    assert ce.runnable(ex) is None
    bad = ce.check(ex)
    assert bad is not None and "no longer prints" in bad and "9.99B" in bad
    assert ce.matches(["a", "...", "c"], ["a", "b", "c"]) is None
    assert ce.matches(["c", "a"], ["a", "b", "c"]) == "a"
