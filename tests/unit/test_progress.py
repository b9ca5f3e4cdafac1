"""The suite's wait on long builds (tests/progress.py): a hang detector on the CPU the waited-on
session uses, not a stopwatch. Real processes: one that computes longer than the idle limit
is waited for; one that sleeps is called a hang, with its processes named; one that ends
first is named with its exit status."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests import background
from tests.progress import following, session_cpu, wait_busy

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def _start(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def test_a_session_that_computes_is_waited_for_past_the_idle_limit(tmp_path: Path) -> None:
    flag = tmp_path / "done"
    # 3 s of CPU in a child of the session's leader, then the flag: three times the limit
    p = _start(
        "import subprocess, sys, pathlib\n"
        f"subprocess.run([sys.executable, '-c', {BURN.format(s=3)!r}])\n"
        f"pathlib.Path({str(flag)!r}).touch()\nimport time; time.sleep(30)\n"
    )
    try:
        wait_busy(p, flag.exists, "a build", idle=1.0)
        cpu, procs = session_cpu(p.pid)
        assert cpu >= 3.0 and any(x.startswith(f"{p.pid} ") for x in procs), (cpu, procs)
    finally:
        p.kill()
        p.wait()


def test_a_session_that_uses_no_cpu_is_a_hang_named_with_its_processes(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("compiling deepspeed_aio_utils.cpp\n")
    p = _start("import time; time.sleep(60)")
    try:
        with pytest.raises(RuntimeError) as e:
            wait_busy(p, lambda: False, "a build", log, idle=2.0)
        assert "a build used no CPU for 2 s" in str(e.value)
        assert f"{p.pid} S python" in str(e.value) and "deepspeed_aio_utils" in str(e.value)
    finally:
        p.kill()
        p.wait()


def test_a_waited_on_session_follows_its_threads_priority() -> None:
    """A build started by a set-up at the lowest priority and waited on while a test raises
    the set-up thread's (tests/vm/guest_ops.py): left behind, a 4 s build beside two nice-0
    loops had not ended after 90 s. Here the thread lowers its own priority (allowed without
    root), and the session's process and its autogroup follow at the next call; the test's
    thread keeps its own."""
    p = _start("import time; time.sleep(60)")
    seen: list[tuple[int, str]] = []

    def setup_thread() -> None:
        follow = following(p.pid)
        follow()
        seen.append((os.getpriority(os.PRIO_PROCESS, p.pid), _autogroup(p.pid)))
        os.setpriority(os.PRIO_PROCESS, 0, lower)
        follow()
        seen.append((os.getpriority(os.PRIO_PROCESS, p.pid), _autogroup(p.pid)))

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    lower = min(mine + 7, 19)
    try:
        t = threading.Thread(target=setup_thread)
        t.start()
        t.join()
        assert seen[0][0] == mine and seen[1][0] == lower, seen
        if seen[0][1]:  # a kernel with autogroups
            assert seen[0][1].endswith(f" nice {mine}") and seen[1][1].endswith(f" nice {lower}")
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine
    finally:
        p.kill()
        p.wait()


def _autogroup(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/autogroup").read_text().strip()
    except OSError:
        return ""


def test_a_process_that_ends_first_is_named_with_its_status() -> None:
    p = _start("import sys; sys.exit(3)")
    with pytest.raises(RuntimeError, match="a build exited 3"):
        wait_busy(p, lambda: False, "a build", idle=60.0)


def test_a_background_command_that_computes_past_its_idle_limit_is_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """tests/background.py's wait: a command of the mutation gate's kind, 3 s of CPU with an
    idle limit of 1 s, ends with its own status and output; one that sleeps past it is
    stopped, its outcome saying so."""
    burn = [sys.executable, "-c", BURN.format(s=3) + "print('scored')"]
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setitem(background.COMMANDS, "burn", lambda: background.Command(burn, 0, idle=1))
    monkeypatch.setitem(background.COMMANDS, "nap", lambda: background.Command(sleep, 0, idle=2))
    try:
        done = background.result("burn")
        assert done.returncode == 0 and done.stdout == "scored\n", done
        assert done.seconds >= 3 and not done.early, done
        hung = background.result("nap")
        assert hung.returncode == -9 and "taken for hung: nap used no CPU for 2 s" in hung.stderr
        assert 2 <= hung.seconds < 30, hung
    finally:  # these two only: the session's own (the mutation gate) may be running
        for name in ("burn", "nap"):
            background.DONE.pop(name, None)
            r = background._running.pop(name, None)
            if r is not None:
                background._stop(r)
