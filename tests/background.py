"""Commands of minutes whose test only waits for their outcome: the mutation score and the
set-up in an empty Debian root. Each starts in the background when the first test marked
``beside_study`` begins (tests/conftest.py), in a session of its own, and its test, which
runs last of its group, waits for it: the two go on while the tests beside them wait on
workers, drives and guests. Run alone, a test starts its command itself. Either way the test
judges what the command printed and left, never how long it took: its wait is a hang
detector (tests/progress.py), which takes the command for hung only once its session has
used no CPU for a while, however long it has run on a host busy with other work.

A test names its command with ``@pytest.mark.background(NAME)``; NAME is a key of COMMANDS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.progress import IDLE, wait_busy

TOP = Path(__file__).resolve().parents[1]


@dataclass
class Command:
    argv: list[str]
    nice: int
    #: seconds without any CPU used by its session after which it is taken for hung
    idle: float = IDLE
    env: dict[str, str] = field(default_factory=dict)
    #: a scratch folder of the command's, removed when its test has judged it
    work: Path | None = None


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    #: where it ran, seconds from its start to its end, and whether it began in the background
    work: Path | None
    seconds: float
    early: bool


def _mutation() -> Command:
    work = Path(tempfile.mkdtemp(prefix="iotune-mutation-out-"))
    return Command(
        argv=[
            sys.executable,
            str(TOP / "scripts" / "mutation.py"),
            "--min",
            "85",
            "--half",
            "--json",
            str(work / "mutation.json"),
        ],
        nice=19,
        env={"CI": ""},
        work=work,
    )


#: between the fresh root's two set-ups' output
TEST_MODE = "=== scripts/setup.sh test ==="


def _fresh_root() -> Command:
    work = Path(tempfile.mkdtemp(prefix="iotune-fresh-root-"))
    return Command(
        argv=[
            str(TOP / "tests" / "tools" / "fresh_root.sh"),
            str(TOP),
            str(work / "fresh"),
            # on a kernel with BTF the set-up installs no LLVM, no headers and no bcc for
            # trace: libbpf's prebuilt CO-RE object serves
            "sh",
            "-c",
            "if dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' | grep -E "
            "'^ii +(libllvm|libclang|linux-headers|python3-bpfcc|bpfcc|clang)' >&2; then "
            "echo 'installed for run:' >&2; exit 3; fi; iotune --json doctor --for trace "
            f"> /tmp/doctor.json && echo '{TEST_MODE}' >&2 && "
            "scripts/setup.sh test --collect-only -q tests/root/test_nodes_root.py >&2 && "
            "for t in sshd ssh pdsh nvme ip rdma; do command -v $t >&2 || exit 4; done && "
            "cat /tmp/doctor.json",
        ],
        nice=10,
        # mmdebstrap and the set-up download for minutes: a slow mirror uses little CPU
        idle=900,
        work=work,
    )


COMMANDS = {"mutation": _mutation, "fresh_root": _fresh_root}


@dataclass
class _Running:
    cmd: Command
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    start: float
    early: bool


_running: dict[str, _Running] = {}
#: each command waited for: seconds from its start to its end, and whether it began early
#: (tests/conftest.py prints them at the end of the run)
DONE: dict[str, tuple[float, bool]] = {}


def start(name: str, early: bool = True) -> None:
    """Starts NAME's command unless it runs already; its output goes to files (a pipe that
    nobody reads while the tests go on would fill and stop it)."""
    if name in _running:
        return
    cmd = COMMANDS[name]()
    logs = Path(tempfile.mkdtemp(prefix=f"iotune-bg-{name}-"))
    out, err = logs / "stdout", logs / "stderr"
    env = {**os.environ, **cmd.env}
    # the command's own workers start as plain processes (the root tier's zygote is the
    # tests' own, and may not exist yet)
    env.pop("IOTUNE_ZYGOTE", None)
    with out.open("wb") as fo, err.open("wb") as fe:
        proc = subprocess.Popen(
            ["nice", "-n", str(cmd.nice), *cmd.argv],
            stdin=subprocess.DEVNULL,
            stdout=fo,
            stderr=fe,
            env=env,
            # a session of its own, stopped as one group at the session's end. Under the
            # kernel's autogroup scheduling that session takes its own share of the cores,
            # nice or not: measured on this 2-core host (benchmarks/RESULTS.md), the whole
            # run is shorter so (1763 s) than with the commands in the tests' session at
            # nice 19 (1886 s), where they got only the idle cores and were left to the end,
            # and the vm guests' tests waited on them there
            start_new_session=True,
        )
    _running[name] = _Running(cmd, proc, out, err, time.monotonic(), early)


def result(name: str) -> Outcome:
    """NAME's outcome: started now where the session did not start it, waited for while its
    session uses CPU (after its idle limit without any, its group is stopped and the
    outcome says so)."""
    start(name, early=False)
    r = _running[name]
    hung = ""
    try:
        wait_busy(r.proc, lambda: r.proc.poll() is not None, name, idle=r.cmd.idle)
        code = r.proc.returncode
    except RuntimeError as e:
        _stop(r)
        code, hung = -9, f"\n[background] taken for hung: {e}"
    err = r.err.read_text(errors="replace") + hung
    outcome = Outcome(
        code,
        r.out.read_text(errors="replace"),
        err,
        r.cmd.work,
        time.monotonic() - r.start,
        r.early,
    )
    shutil.rmtree(r.out.parent, ignore_errors=True)
    DONE[name] = (outcome.seconds, outcome.early)
    return outcome


def _stop(r: _Running) -> None:
    if r.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(r.proc.pid, signal.SIGKILL)
        r.proc.wait()


def stop_all() -> None:
    """At the session's end: nothing started for a test outlives the session."""
    for r in _running.values():  # all stopped first, then their folders removed
        _stop(r)
    for r in _running.values():
        shutil.rmtree(r.out.parent, ignore_errors=True)
        if r.cmd.work is not None and r.cmd.work.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(r.cmd.work)], check=False)
    _running.clear()
