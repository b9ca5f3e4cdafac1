"""Mutation testing of the pure model code (scripts/mutation.py, mutmut): at least 85% of the
mutants of the modules in setup.cfg's [mutmut] section are killed by the unit tests named
there, every survivor either killed or explained. It runs in the background from the first
test beside the vm study's guest, at nice 19: it uses the cores only where nothing else
wants them (tests/background.py)."""

from __future__ import annotations

import json

import pytest

from tests import background


@pytest.mark.background("mutation")
def test_at_least_85_percent_of_the_model_codes_mutants_are_killed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # started with the first test beside the study, at nice 19 (tests/background.py)
    p = background.result("mutation")
    with capsys.disabled():  # the score on the terminal, passed or not, for RESULTS
        print("\n" + next((x for x in p.stdout.splitlines() if x.startswith("mutation: ")), ""))
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert p.work is not None
    doc = json.loads((p.work / "mutation.json").read_text())
    stats = doc["stats"]
    # every module was mutated and every mutant ran against a test
    assert stats["total"] > 2000 and doc["score"] >= 85.0, stats
    assert len(doc["modules"]) >= 5, doc["modules"]
