"""The zygote (iotune/workers/zygote.py) with real processes and a real socket: a worker
forked from it gets the client's argv, environment, directory and standard streams, its
exit code comes back through the client, signals to the client reach it, and the tracer
learns its pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from iotune.proc import ZYGOTE_ENV, command

TOP = Path(__file__).resolve().parents[2]
TARGET = "tests.unit.zygote_target"


@pytest.fixture
def zygote(tmp_path: Path) -> Iterator[Path]:
    sock = tmp_path / "z.sock"
    server = subprocess.Popen(
        [sys.executable, "-m", "iotune.workers.zygote", "serve", str(sock), "json"],
        cwd=TOP,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        assert time.monotonic() < deadline, "the zygote did not come up"
        time.sleep(0.05)
    yield sock
    server.kill()
    server.wait()


def command_for(sock: Path, *args: str) -> list[str]:
    """iotune's command for the target worker where $IOTUNE_ZYGOTE names *sock*."""
    old = os.environ.get(ZYGOTE_ENV)
    os.environ[ZYGOTE_ENV] = str(sock)
    try:
        argv = command(TARGET, *args)
    finally:
        if old is None:
            os.environ.pop(ZYGOTE_ENV)
    assert argv[:5] == [sys.executable, "-m", "iotune.workers.zygote", "client", str(sock)]
    return argv


def _client(
    sock: Path, *args: str, events: Path | None = None, **kw: object
) -> subprocess.Popen[str]:
    env = {**os.environ, ZYGOTE_ENV: str(sock), "ZYGOTE_TEST": "passed", "PYTHONPATH": str(TOP)}
    if events is not None:
        env["IOTUNE_EVENTS"] = str(events)
    argv = command_for(sock, *args)
    p: subprocess.Popen[str] = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,  # type: ignore[call-overload]
    )
    return p


def test_without_a_zygote_a_worker_is_a_fresh_interpreter(tmp_path: Path) -> None:
    os.environ.pop(ZYGOTE_ENV, None)
    assert command(TARGET, "a") == [sys.executable, "-m", TARGET, "a"]
    os.environ[ZYGOTE_ENV] = str(tmp_path / "gone.sock")  # named but not running
    try:
        assert command(TARGET, "a") == [sys.executable, "-m", TARGET, "a"]
    finally:
        os.environ.pop(ZYGOTE_ENV)


def test_a_client_without_a_server_starts_the_worker_itself(tmp_path: Path) -> None:
    """A socket file whose zygote has gone (or a path that is no socket): one line on stderr,
    then the worker runs in the client's process, with its argv, streams and exit code."""
    import socket

    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(stale))  # bound, never listening: what a killed server leaves behind
    plain = tmp_path / "plain-file"
    plain.write_text("")
    for path in (stale, plain):
        p = _client(path, "exit", "5", cwd=tmp_path)
        out, err = p.communicate("hi\n", timeout=60)
        assert p.returncode == 5, err
        said = json.loads(out)
        assert said["pid"] == p.pid and said["argv"] == ["exit", "5"] and said["stdin"] == "hi"
        assert said["forked"] is False
        first, *rest = err.splitlines()
        assert first == (
            f"iotune zygote: no server at {path} (Connection refused); "
            f"{TARGET} runs in this process"
        )
        assert rest == ["to stderr"]


def test_the_forked_worker_gets_the_clients_streams_env_and_exit_code(
    zygote: Path, tmp_path: Path
) -> None:
    events = tmp_path / "events.jsonl"
    p = _client(zygote, "exit", "7", events=events, cwd=tmp_path)
    out, err = p.communicate("hello\n", timeout=60)
    assert p.returncode == 7, err
    said = json.loads(out)
    assert said == {
        "argv": ["exit", "7"],
        "env": "passed",
        "pid": said["pid"],
        "cwd": str(tmp_path),
        "stdin": "hello",
        "forked": True,
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }
    assert said["pid"] != p.pid  # forked by the zygote, not the client itself
    assert "to stderr" in err
    # the tracer learns the worker's pid before it starts
    assert json.loads(events.read_text()) == {"event": "process", "pid": said["pid"]}


def test_the_forked_worker_runs_at_the_clients_cpu_priority(zygote: Path) -> None:
    """`nice iotune run ...` with a zygote: the worker is forked by the server, whose
    priority is not the client's; it takes the client's, as a worker started by the client
    would have."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    for lower in (3, 11):
        env = {**os.environ, ZYGOTE_ENV: str(zygote), "PYTHONPATH": str(TOP)}
        argv = ["nice", "-n", str(lower), *command_for(zygote, "exit", "0")]
        p = subprocess.run(
            argv, env=env, input="\n", capture_output=True, text=True, timeout=60, check=False
        )
        said = json.loads(p.stdout)
        assert p.returncode == 0 and said["forked"] is True, p.stderr
        assert said["nice"] == min(mine + lower, 19), said


def test_a_worker_that_raises_exits_1_with_its_traceback(zygote: Path) -> None:
    p = _client(zygote, "raise")
    _out, err = p.communicate("\n", timeout=60)
    assert p.returncode == 1
    assert "RuntimeError: the worker's own failure" in err


def _hanging(sock: Path) -> tuple[subprocess.Popen[str], int]:
    """A client whose worker has started and waits: the client and the worker's pid."""
    p = _client(sock, "hang")
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write("\n")
    p.stdin.flush()
    return p, int(json.loads(p.stdout.readline())["pid"])


def _assert_gone(pid: int) -> None:
    """The worker *pid* ends within 10 s."""
    with pytest.raises(ProcessLookupError):
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)


def test_a_signal_to_the_client_reaches_the_worker(zygote: Path) -> None:
    p, pid = _hanging(zygote)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert p.returncode == 143
    _assert_gone(pid)


def test_a_killed_client_takes_its_worker_along(zygote: Path) -> None:
    p, pid = _hanging(zygote)
    p.kill()
    p.wait(timeout=30)
    _assert_gone(pid)


def test_a_worker_that_ignores_sigterm_is_killed_with_its_helpers(zygote: Path) -> None:
    """Its client killed: SIGTERM to the worker's process group (its helper ends on it),
    SIGKILL KILL_AFTER_S later to the worker that ignores SIGTERM, as the tracer does to a
    workload it started; nothing of it goes on in the zygote's process tree."""
    from iotune.workers.zygote import KILL_AFTER_S

    p = _client(zygote, "stubborn")
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write("\n")
    p.stdin.flush()
    pid = int(json.loads(p.stdout.readline())["pid"])
    helper = int(p.stdout.readline())
    killed = time.monotonic()  # before the kill: the server's clock starts after it
    p.kill()
    p.wait(timeout=30)
    # the helper ends on SIGTERM (a zombie: its parent, the worker, does not reap it)
    while _state(helper) not in ("Z", None):
        assert time.monotonic() - killed < 5, "the helper did not get SIGTERM"
        time.sleep(0.05)
    assert _state(pid) not in ("Z", None)  # the worker ignored it
    deadline = killed + KILL_AFTER_S + 10
    with pytest.raises(ProcessLookupError):
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
    assert time.monotonic() - killed >= KILL_AFTER_S - 1
    _assert_gone(helper)  # reaped once its parent is gone


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, Z, ...), None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_a_client_whose_parent_is_killed_takes_its_worker_along(zygote: Path) -> None:
    """iotune killed with SIGKILL: its client gets SIGTERM (PR_SET_PDEATHSIG) and passes it
    on, so the worker does not go on in the zygote's process tree."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import json, subprocess, sys, time\n"
            "p = subprocess.Popen(json.loads(sys.argv[1]), stdin=subprocess.PIPE,\n"
            "                     stdout=subprocess.PIPE, text=True)\n"
            "p.stdin.write('\\n'); p.stdin.flush()\n"
            "print(json.loads(p.stdout.readline())['pid'], flush=True)\n"
            "time.sleep(60)\n",
            json.dumps(command_for(zygote, "hang")),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TOP)},
    )
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    os.kill(pid, 0)  # the worker runs
    parent.kill()
    parent.wait(timeout=30)
    _assert_gone(pid)


def test_the_code_is_warmed_only_where_it_lies_on_a_traced_drive() -> None:
    """iotune.train.preflight.code_on: the virtualenv's own drive holds the code; a drive that
    holds none of it does not (and then the run reads no code into the page cache)."""
    from iotune.probes.sysfs import SysTree
    from iotune.trace.targets import resolve_path
    from iotune.train.preflight import code_drives, code_on

    if code_drives() is None:
        # a folder of the code on a filesystem this host's sysfs names no drive for (a
        # sandbox's root): where the code lies is not known, so it is warmed anyway
        assert code_on(("no-such-disk",)) is True
        return
    assert code_on(("no-such-disk",)) is False
    mine = resolve_path(SysTree("/"), sys.prefix).disks
    if mine:  # the virtualenv lies on a block device (not 9p, tmpfs, ...)
        assert code_on(mine) is True


def test_the_cpus_description_is_asked_once_a_process() -> None:
    """DeepSpeed asks py-cpuinfo for each op it loads and each CPU Adam it makes; each answer
    is a Python process started anew (1.27 s on an AVX2 host). In a process of its own:
    the first answer's Python process is the only one, whoever asks after."""
    code = (
        "import subprocess\n"
        "from iotune.workers import cpu_info_once\n"
        "started = []\n"
        "real = subprocess.Popen.__init__\n"
        "def counted(self, *a, **k):\n"
        "    started.append(a[0] if a else k.get('args'))\n"
        "    real(self, *a, **k)\n"
        "subprocess.Popen.__init__ = counted\n"
        "cpu_info_once(); cpu_info_once()\n"
        "from cpuinfo import get_cpu_info\n"
        "first = get_cpu_info(); n = len(started)\n"
        "import cpuinfo\n"
        "assert cpuinfo.get_cpu_info() is first and get_cpu_info() is first\n"
        "print(n, len(started), first['arch'])\n"
    )
    argv = [sys.executable, "-c", code]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    asked, after, arch = p.stdout.split()
    # the first answer started its process(es); the two asks after it, none
    assert int(asked) >= 1 and after == asked and arch in ("X86_64", "ARM_8", "ARM_7"), p.stdout
