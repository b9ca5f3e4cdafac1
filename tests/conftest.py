"""Test tiers by directory (tests/unit, tests/root, tests/vm, tests/gpu) and the CI rule:
with CI=true a skipped test of the unit, root or vm tier fails the run, and so does a
selected tier that ran no test at all."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings as _hypothesis

from iotune.proc import ZYGOTE_ENV, worker_env
from tests import background
from tests.progress import wait_busy

# Property tests draw new cases on each run where a developer runs them; under CI the draw is
# the same on every run (derandomized), so a landing is judged by the code, not by the luck of
# a draw, and nothing is written to the example database of a fresh clone.
_hypothesis.register_profile("ci", derandomize=True, database=None, print_blob=True)
# Under mutation testing (scripts/mutation.py) each mutant reruns the tests that reach it: a
# few examples a property find what a mutant breaks, at a fraction of the time.
_hypothesis.register_profile("mutation", derandomize=True, database=None, max_examples=12)
if os.environ.get("IOTUNE_HYPOTHESIS") == "mutation":
    _hypothesis.load_profile("mutation")
    # Each mutant's tests run in a process forked from one that collected them
    # (scripts/mutation.py): what they would import at run time (the command line, its
    # tables, rich) is imported there once, not again for each of the thousands of mutants.
    # Not the workers, the hook or the report: processes of their own, or matplotlib.
    import importlib
    import pkgutil

    import iotune

    for _mod in pkgutil.walk_packages(iotune.__path__, "iotune."):
        skip = ("iotune.workers", "iotune.hook", "iotune.report", "iotune.__main__")
        if not _mod.name.startswith(skip):
            importlib.import_module(_mod.name)
elif os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    _hypothesis.load_profile("ci")

TIERS = ("unit", "root", "vm", "gpu")
CI_TIERS = ("unit", "root", "vm")
_outcomes: dict[str, Counter[str]] = {t: Counter() for t in TIERS}
_selected: set[str] = set()
#: wall seconds per test group (see _group) and per tier, summed over setup, call, teardown
_group_seconds: dict[int, float] = {}
_tier_seconds: dict[str, float] = {}
GROUPS = ("first", "beside the study's runs", "the study's own")


def _tier(item: pytest.Item) -> str | None:
    parts = item.path.parts
    for tier in TIERS:
        if tier in parts:
            return tier
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test gets its tier's marker, and the unit tier ``beside_study`` (pure logic).
    The order: the tests not marked ``beside_study``, then those marked, during which the
    RAID0 study's runs go on in their guest (tests/vm/conftest.py), then the tests that use
    that guest; each group in the order collected."""
    for item in items:
        tier = _tier(item)
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
        if tier == "unit":
            item.add_marker(pytest.mark.beside_study)
    items.sort(key=_order)
    if os.environ.get("IOTUNE_HYPOTHESIS") == "mutation":
        items.sort(key=_fastest_first())


#: under mutation testing, a line per mutant killed: its function, then the test that failed
#: (in the folder the tests run in, shared by mutmut's forks, each appending its own line)
KILLERS = Path(".iotune-killers")


def _mutant_function() -> str | None:
    name = os.environ.get("MUTANT_UNDER_TEST", "")
    return name.partition("__mutmut_")[0] if "__mutmut_" in name else None


def _fastest_first() -> Callable[[pytest.Item], tuple[int, float]]:
    """Under mutation testing, a mutant's tests in the order most likely to stop its run
    soon (mutmut stops at the first failing test): first those that killed earlier mutants
    of the same function in this run, the most kills first; then by the seconds each took in
    mutmut's run of them all (its stats, in the folder the tests run in), the quickest first,
    so that a property test of 2.4 s does not run before tests of milliseconds. The order
    only changes how soon a mutant is judged, never whether it is killed: every test that
    reaches it still runs until one fails. Where there are no stats yet (that first run
    itself), the order stays."""
    stats = Path("mutmut-stats.json")
    seconds: dict[str, float] = {}
    if stats.exists():
        with contextlib.suppress(ValueError, OSError):
            seconds = json.loads(stats.read_text()).get("duration_by_test", {})
    kills: Counter[str] = Counter()
    fn = _mutant_function()
    if fn is not None and KILLERS.exists():
        with contextlib.suppress(OSError):
            for line in KILLERS.read_text().splitlines():
                where, _, test = line.partition("\t")
                if where == fn and test:
                    kills[test] += 1
    return lambda item: (-kills[item.nodeid], seconds.get(item.nodeid, 0.0))


def _group(item: pytest.Item) -> int:
    if "lab" in getattr(item, "fixturenames", ()):
        return 2
    return 1 if item.get_closest_marker("beside_study") is not None else 0


def _order(item: pytest.Item) -> tuple[int, int]:
    """By group; within one, a test that waits for a background command (tests/background.py)
    last, so that the command has the whole group's time beside it."""
    return _group(item), 1 if item.get_closest_marker("background") is not None else 0


#: the background commands of the selected tests, until they start
_pending: list[str] = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The selected tests' background commands start with the first test marked
    ``beside_study``: before it run the tests that want the host to themselves."""
    if _pending and item.get_closest_marker("beside_study") is not None:
        for name in _pending:
            background.start(name)
        _pending.clear()


def pytest_unconfigure(config: pytest.Config) -> None:
    background.stop_all()


#: what the root and vm tiers write at their peak in the temporary folder's filesystem (loop
#: devices, the guests' drive images, the runs' swap files): 24.8 GB measured in a whole
#: `.ci/run` (benchmarks/RESULTS.md, 2026-11-30), with a margin
DISK_NEEDED = 32 * 10**9


def disk_short(path: str, needed: int = DISK_NEEDED) -> str | None:
    """One line saying the tiers cannot run where *path*'s filesystem has less than *needed*
    bytes free, and what to do; None where it has enough."""
    free = shutil.disk_usage(path).free
    if free >= needed:
        return None
    return (
        f"the root and vm tiers need {needed / 1e9:.0f} GB free under {path}, which has "
        f"{free / 1e9:.1f} GB: free some (old pytest folders in "
        f"{path}/pytest-of-*, the vm tier's kept guest folders {path}/iotune-*vm-*) "
        "or point TMPDIR at a larger filesystem"
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    _pending[:] = [str(m.args[0]) for i in session.items for m in i.iter_markers("background")]
    for item in session.items:
        tier = _tier(item)
        if tier:
            _selected.add(tier)
    # a filesystem that fills mid-run fails tests at random, an hour in: refuse at once
    if _selected & {"root", "vm"} and (short := disk_short(tempfile.gettempdir())):
        pytest.exit(short, returncode=1)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    start = time.monotonic()
    try:
        return (yield)
    finally:
        spent = time.monotonic() - start
        group = _group(item)
        _group_seconds[group] = _group_seconds.get(group, 0.0) + spent
        tier = _tier(item)
        if tier:
            _tier_seconds[tier] = _tier_seconds.get(tier, 0.0) + spent


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each test's outcome in its tier's count; under mutation testing, the test that killed
    a mutant, for its function's next mutants' order (_fastest_first)."""
    fn = _mutant_function()
    if fn is not None and report.failed:
        with contextlib.suppress(OSError), KILLERS.open("a") as fh:
            fh.write(f"{fn}\t{report.nodeid}\n")  # one short write: whole between forks
    tier = next((t for t in TIERS if f"tests/{t}/" in report.nodeid), None)
    if tier is None:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _outcomes[tier][report.outcome] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = []
    for tier in TIERS:
        c = _outcomes[tier]
        if c or tier in _selected:
            lines.append(
                f"{tier}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
            )
    terminalreporter.write_sep("=", "tiers")
    for line in lines:
        terminalreporter.write_line(line)
    # where the wall time went: the groups run one after the other, the tiers within them
    terminalreporter.write_line(
        "wall seconds by group: "
        + ", ".join(f"{GROUPS[g]} {_group_seconds[g]:.0f}" for g in sorted(_group_seconds))
        + "; by tier: "
        + ", ".join(f"{t} {_tier_seconds[t]:.0f}" for t in TIERS if t in _tier_seconds)
    )
    if background.DONE:
        terminalreporter.write_line(
            "in the background: "
            + ", ".join(
                f"{name} {sec:.0f} s{'' if early else ' (started by its test)'}"
                for name, (sec, early) in background.DONE.items()
            )
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("IOTUNE_HYPOTHESIS") == "mutation" and "torch" in sys.modules:
        # mutmut runs the selection in its own process, then forks each of the thousands of
        # mutants from it: torch there makes each fork copy a process four times the size
        # (setup.cfg's [mutmut] deselects the tests that import DeepSpeed)
        print(
            "mutation: a selected test imported torch into mutmut's process; "
            "deselect it in setup.cfg's [mutmut]",
            file=sys.stderr,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if os.environ.get("IOTUNE_HYPOTHESIS") == "mutation":
        # pytest (8.4 on) collects garbage five times as each session ends. In a mutant's
        # process, forked from mutmut's, that pass walked every object mutmut's process had
        # made, and so copied all its pages: half a second of each mutant's run. Frozen here,
        # in mutmut's own run of the selection, they are left out of the forks' collections.
        gc.collect()
        gc.freeze()
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    problems = []
    for tier in CI_TIERS:
        if _outcomes[tier]["skipped"]:
            problems.append(f"{_outcomes[tier]['skipped']} skipped test(s) in the {tier} tier")
        if tier in _selected and not sum(_outcomes[tier].values()):
            problems.append(f"the {tier} tier ran no test")
    markexpr = session.config.getoption("markexpr") or ""
    for tier in CI_TIERS:
        if markexpr and tier not in _selected:
            problems.append(f"the {tier} tier was not selected ({markexpr!r})")
    if problems:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            tr.write_sep("!", "CI: " + "; ".join(problems), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One zygote for the session (iotune/workers/zygote.py, the path a user takes with
    $IOTUNE_ZYGOTE): a server that imported torch, DeepSpeed and transformers and loaded
    DeepSpeed's ops once, its socket's path. Started by the first test that wants it (the
    root tier's first, or a unit test that starts workers), and kept to the session's end:
    a worker's imports cost about 6 s on a quiet host, three times that beside the vm
    tier's guests, paid once instead of in each run."""
    sock = tmp_path_factory.mktemp("zygote") / "workers.sock"
    log_path = sock.with_suffix(".log")
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "iotune.workers.zygote", "serve", str(sock)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env={**os.environ, **worker_env()},
            start_new_session=True,
        )
    try:
        # its imports, and on a host that never built DeepSpeed's ops, their first build:
        # minutes where the compiler cache is cold, as long as the compilers work
        try:
            wait_busy(server, sock.exists, "the zygote (imports, DeepSpeed's op builds)", log_path)
        except RuntimeError as e:
            pytest.fail(str(e))
        yield str(sock)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@pytest.fixture
def zygote_workers(zygote: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's workers fork from the session's zygote, as they would for a user who set
    $IOTUNE_ZYGOTE: the same worker modules, without their imports."""
    monkeypatch.setenv(ZYGOTE_ENV, zygote)
