"""The documentation's printed examples still print what they show: scripts/check_examples.py
runs every example that needs nothing but this checkout and finds its lines in order."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

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


#: the recorded run of the README's RAID0 study, and the planner's runs of the same study
RUN_A = (
    "benchmarks/RESULTS.md#the-raid0-study-in-the-vm-tier-end-to-end-testsvmtest_study_vmpy-"
    "this-intel-2-core-host-2026-11-25"
)
RUN_B = "benchmarks/RESULTS.md#the-drives-planner-before-purchase-2026-11-26"


def test_every_quoted_figure_is_its_recordings() -> None:
    """The figures the README and the pages quote from a run or a command's output: the
    RAID0 study's steps (one run each, named), the planner's accuracy, the host-RAM peaks and
    the endurance the estimate page quotes."""
    ce = _checker()
    qs = [
        q
        for md in (TOP / "README.md", *sorted((TOP / "docs").rglob("*.md")))
        for q in ce.quotes_in(md)
    ]
    assert len(qs) >= 9, [q.where for q in qs]
    assert [bad for q in qs for bad in ce.check_quote(q)] == []
    sources = {q.source for q in qs}
    assert {RUN_A, RUN_B, "above"} <= sources


@pytest.mark.parametrize(
    ("figures", "source", "text"),
    [
        # the README's planner sentence, said of the table's run (the CI run measured them)
        ("25.78 13.17 7.02", RUN_A, "The measured steps were 25.78, 13.17 and 7.02 s."),
        # estimate.md's accuracy table's run measured 25.67, 13.07, 7.04
        ("26.17 13.61 7.65", RUN_B, "measured 26.17, 13.61, 7.65 s"),
        # the estimate page's peaks as it had them, and a DWPD range of another table
        (
            "81.9",
            "$ iotune estimate params_opt_nvme_16b --set model.num_hidden_layers=60",
            "peaks at 81.9 GiB",
        ),
        ("30.4 12.5", "$ iotune estimate opt_nvme_1b", "30.4 GiB peak against 12.5"),
    ],
)
def test_a_figure_that_is_not_its_recordings_is_caught(
    figures: str, source: str, text: str, tmp_path: Path
) -> None:
    ce = _checker()
    md = tmp_path / "doc.md"
    md.write_text(f"<!-- figures {figures} from {source} -->\n{text}\n")
    (q,) = ce.quotes_in(md)
    bad = ce.check_quote(q)
    assert len(bad) == len(figures.split()), bad
    assert all("is not a figure of" in b for b in bad), bad


def test_the_dwpd_range_of_another_table_is_caught(tmp_path: Path) -> None:
    """estimate.md quoted 34 to 89 after the table whose DWPD runs 32.34 to 89.00 (34 was
    the queue-depth-8 table's 33.93)."""
    ce = _checker()
    page = (TOP / "docs/commands/estimate.md").read_text()
    example = page[
        page.index(
            "```\n$ iotune estimate opt_nvme_16b --set model.num_hidden_layers=60 --set ds.aio.queue_depth=16"
        ) :
    ]
    example = example[: example.index("```\n", 4) + 4]
    md = tmp_path / "doc.md"
    md.write_text(
        example
        + "\n<!-- figures 7 16 34 89 from above -->\n7 days on one and 16 on ten; 34 to 89.\n"
    )
    (q,) = ce.quotes_in(md)
    assert q.above is not None
    assert ce.check_quote(q) == [f"{q.where}: 34 is not a figure of the example at {q.above.where}"]


def test_quoted_figures_rules(tmp_path: Path) -> None:
    ce = _checker()
    rec = tmp_path / "rec.md"
    rec.write_text(
        "# Results\n\n## The run of 2026-11-25 (a `.ci/run`, 2-core)\n\nstep 26.17 s, +6.5%, "
        "1,200 TBW\n\n## Another run\n\nstep 25.78 s\n"
    )
    anchor = ce.anchor("## The run of 2026-11-25 (a `.ci/run`, 2-core)")
    assert anchor == "the-run-of-2026-11-25-a-cirun-2-core"
    md = tmp_path / "doc.md"
    md.write_text(
        f"<!-- figures 26.2 6.5% 1,200 from {rec}#{anchor} -->\n"
        "From 26.2 s, within 6.5%, 1,200 TBW.\n\n"
        f"<!-- figures 25.78 from {rec}#{anchor} -->\nit took 25.78 s\n\n"
        f"<!-- figures 13.6 from {rec} -->\nnot here\n\n"
        f"<!-- figures in columns Step s from {rec}#{anchor} -->\n"
        "| Strategy | Step s |\n|---|---|\n| a | 26.17 |\n| b | 25.78 |\n\n"
        f"<!-- figures 26.17 from {rec}#nowhere -->\n26.17\n"
    )
    got = [ce.check_quote(q) for q in ce.quotes_in(md)]
    assert got[0] == []
    assert got[1] == [f"{md}:4: 25.78 is not a figure of {rec}#{anchor}"]
    assert got[2] == [f"{md}:7: figure 13.6 is listed but not in the text below it"]
    assert got[3] == [f"{md}:10: 25.78 is not a figure of {rec}#{anchor}"]
    assert got[4] == [f"{md}:16: figures from {rec}#nowhere: {rec} has no section #nowhere"]
    # rounded to the figure's decimals; a figure without a sign may quote a negative one
    assert ce.quotes("34", "33.93") and not ce.quotes("34", "32.34")
    assert ce.quotes("7.7", "7.65") and ce.quotes("6%", "-5.5%")
    assert not ce.quotes("+1.0", "-1.0") and ce.quotes("-0.0", "-0.0")
    assert ce.numbers("-2.3 to +1.4%, 1,200 TBW, 66-138 s, 1, 2, 4") == [
        "-2.3", "+1.4", "1,200", "66", "138", "1", "2", "4"
    ]  # fmt: skip


def test_the_report_page_names_every_figure_the_report_draws() -> None:
    """Each figure `iotune report` can write (the names its drawing functions give) is on
    its page, by file name."""
    import re

    page = (TOP / "docs/commands/report.md").read_text()
    drawn = []
    for src in ("figures.py", "sweep_figures.py", "latency_figures.py"):
        text = (TOP / "iotune/report" / src).read_text()
        drawn += re.findall(r"return Drawn\(\s*f?\"([^\"]+)\"", text)
    names = [re.sub(r"\{[^}]*\}", "NAME", n) + ".png" for n in drawn]
    assert len(names) >= 9, names
    assert [n for n in names if f"`{n}`" not in page] == []
