"""The order a mutant's tests run in under mutation testing (tests/conftest.py): the tests
that killed its function's earlier mutants first, the most kills first, then the quickest."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest


def _order(names: list[str]) -> list[str]:
    key = conftest._fastest_first()
    items = [SimpleNamespace(nodeid=n) for n in names]
    return [i.nodeid for i in sorted(items, key=key)]  # type: ignore[arg-type]


def test_earlier_killers_of_the_function_run_first_then_the_quickest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    seconds = {"slow": 2.4, "mid": 0.5, "quick": 0.01, "other": 0.02}
    (tmp_path / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": seconds}))
    names = ["slow", "mid", "quick", "other"]
    monkeypatch.setenv("MUTANT_UNDER_TEST", "iotune.units.x_parse__mutmut_7")
    assert _order(names) == ["quick", "other", "mid", "slow"]  # no kills yet: by seconds
    # kills are recorded by the report of a failed test, for the mutant's function only
    for nodeid, fn in [("slow", "x_parse"), ("mid", "x_parse"), ("slow", "x_parse"),
                       ("quick", "x_other")]:  # fmt: skip
        monkeypatch.setenv("MUTANT_UNDER_TEST", f"iotune.units.{fn}__mutmut_3")
        report = SimpleNamespace(failed=True, nodeid=nodeid, when="call", outcome="failed")
        conftest.pytest_runtest_logreport(report)  # type: ignore[arg-type]
    lines = (tmp_path / conftest.KILLERS).read_text().splitlines()
    assert lines[0] == "iotune.units.x_parse\tslow" and len(lines) == 4, lines
    monkeypatch.setenv("MUTANT_UNDER_TEST", "iotune.units.x_parse__mutmut_9")
    assert _order(names) == ["slow", "mid", "quick", "other"]
    # outside mutation testing nothing is recorded and the order is the stats' alone
    monkeypatch.delenv("MUTANT_UNDER_TEST")
    report = SimpleNamespace(failed=True, nodeid="mid", when="call", outcome="failed")
    conftest.pytest_runtest_logreport(report)  # type: ignore[arg-type]
    assert len((tmp_path / conftest.KILLERS).read_text().splitlines()) == 4
    assert _order(names) == ["quick", "other", "mid", "slow"]
