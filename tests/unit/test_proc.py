import subprocess
import sys
from pathlib import Path

import pytest

from iotune import proc
from iotune.errors import (
    CannotExecute,
    CommandFailed,
    CommandTimeout,
    ToolMissing,
    WorkerOutputError,
    last_line,
)


def test_run_returns_output_and_exit_code() -> None:
    done = proc.run(["printf", "%s-%s", "a", "b"])
    assert done.stdout == "a-b"
    assert done.returncode == 0
    assert done.argv[0].endswith("/printf")


def test_run_never_uses_a_shell() -> None:
    # a shell would expand $HOME and split on ';'
    done = proc.run(["echo", "$HOME; echo injected"])
    assert done.stdout == "$HOME; echo injected\n"


def test_failure_is_typed_with_argv_code_and_stderr_tail() -> None:
    with pytest.raises(CommandFailed) as info:
        proc.run(["ls", "/definitely/not/here"])
    exc = info.value
    assert exc.returncode == 2
    assert exc.argv[1] == "/definitely/not/here"
    assert "No such file" in exc.stderr_tail
    assert "exit code 2" in exc.message and "No such file" in exc.message


def test_check_false_returns_failure_as_data() -> None:
    done = proc.run(["false"], check=False)
    assert done.returncode == 1


def test_missing_tool_says_so_without_inventing_a_package() -> None:
    with pytest.raises(ToolMissing) as info:
        proc.run(["iotune-no-such-tool-xyz"])
    assert "iotune-no-such-tool-xyz is not installed (not found on PATH)" in info.value.message
    assert info.value.hint and "apt-get" not in info.value.hint


def test_a_program_path_that_is_not_there_is_no_package_to_install() -> None:
    with pytest.raises(ToolMissing) as info:
        proc.run(["/bin/iotune-nonexistent"])
    assert info.value.message == "no such program: /bin/iotune-nonexistent"
    assert (
        info.value.hint and "apt-get" not in info.value.hint and "check the path" in info.value.hint
    )


def test_missing_known_tool_hint_uses_its_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proc, "which", lambda tool: None)
    with pytest.raises(ToolMissing) as info:
        proc.run(["mkfs.xfs", "-V"])
    assert info.value.hint and "apt-get install xfsprogs" in info.value.hint


def test_timeout_is_typed() -> None:
    with pytest.raises(CommandTimeout) as info:
        proc.run(["sleep", "5"], timeout=0.2)
    assert "did not finish within 0.2 s" in info.value.message


def test_debug_log_has_the_exact_command(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG", logger="iotune.proc")
    proc.run(["echo", "two words"])
    assert any("'two words'" in r.getMessage() for r in caplog.records)


def test_a_program_that_cannot_execute_is_not_called_missing(tmp_path: Path) -> None:
    # present but not executable (EACCES), and executable but not a program (ENOEXEC)
    noexec = tmp_path / "tool"
    noexec.write_text("#!/bin/sh\necho hi\n")
    noexec.chmod(0o644)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\x00\x01\x02 not an executable")
    garbage.chmod(0o755)
    for path, reason in ((noexec, "Permission denied"), (garbage, "Exec format error")):
        for start in (proc.run, proc.spawn):
            with pytest.raises(CannotExecute) as info:
                start([str(path)])
            assert not isinstance(info.value, ToolMissing)
            assert info.value.message == f"cannot run {path}: {reason}"
            assert info.value.hint and "apt-get" not in info.value.hint


def test_worker_json_guards_against_a_worker_that_printed_no_result() -> None:
    ok = proc.run(["printf", 'noise\n{"a": 1}\n'])
    assert proc.worker_json(ok) == {"a": 1}
    for out in ("", "Traceback: boom\n", "[1, 2]\n"):
        done = proc.run(["printf", "%s", out])
        with pytest.raises(WorkerOutputError) as info:
            proc.worker_json(done)
        # a CommandFailed, so every loop that records a failed point catches it
        assert isinstance(info.value, CommandFailed)
        assert "printed no JSON result" in info.value.stderr_tail.splitlines()[-1]


def test_last_line_of_error_output() -> None:
    assert last_line("warning: x\nerror: disk full  \n\n") == "error: disk full"
    assert last_line("  \n") is None
    exc = CommandFailed(["mdadm", "--stop", "/dev/md0"], 1, "")
    assert exc.message == "mdadm --stop /dev/md0 failed with exit code 1: no output"


def test_the_error_before_a_programs_usage_is_its_last_line() -> None:
    """mkfs.xfs on a 508 MiB RAID6 with its stripe (as its stderr read): the error, then the
    usage, whose last line alone told nothing."""
    out = (
        "log stripe unit (524288 bytes) is too large (maximum is 256KiB)\n"
        "log stripe unit adjusted to 32KiB\n"
        "Log size must be at least 64MB.\n"
        "Usage: mkfs.xfs\n"
        "/* blocksize */\t\t[-b size=num]\n"
        "<value> is xxx (512 byte blocks).\n"
    )
    assert last_line(out) == "Log size must be at least 64MB."
    assert last_line("usage: tool [-h]\ntool: error: bad\n") == "tool: error: bad"


def test_a_workers_report_keeps_stdout_and_the_rest_goes_to_stderr() -> None:
    code = (
        "import subprocess\n"
        "from iotune.workers import private_stdout\n"
        "report = private_stdout()\n"
        "print('chatter', flush=True)\n"
        "subprocess.run(['echo', 'from-a-child'], check=True)\n"
        "report.write('{}\\n')\n"
        "report.flush()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert p.stdout == "{}\n"
    assert p.stderr.split() == ["chatter", "from-a-child"]


# a worker that answers each request line: {"n": x} -> {"twice": 2x}; "die" exits 3 after
# a message, "hang" sleeps, "noise" answers a line that is not a JSON object
JSON_WORKER = """
import json, sys, time
for line in sys.stdin:
    req = json.loads(line)
    if req.get("do") == "die":
        print("worker: giving up", file=sys.stderr, flush=True)
        sys.exit(3)
    if req.get("do") == "hang":
        time.sleep(60)
    if req.get("do") == "noise":
        print("[1, 2]", flush=True)
        continue
    print(json.dumps({"twice": 2 * req["n"], "pid": __import__("os").getpid()}), flush=True)
"""


def test_json_worker_answers_many_requests_from_one_process() -> None:
    with proc.JsonWorker([sys.executable, "-c", JSON_WORKER]) as w:
        answers = [w.ask({"n": n}, timeout=30) for n in range(5)]
    assert [a["twice"] for a in answers] == [0, 2, 4, 6, 8]
    assert len({a["pid"] for a in answers}) == 1 and w.started == 1


def test_json_worker_that_dies_costs_one_request_and_a_fresh_one_goes_on() -> None:
    with proc.JsonWorker([sys.executable, "-c", JSON_WORKER]) as w:
        first = w.ask({"n": 1}, timeout=30)
        with pytest.raises(CommandFailed) as died:
            w.ask({"do": "die"}, timeout=30)
        after = w.ask({"n": 2}, timeout=30)
    assert died.value.returncode == 3
    assert last_line(died.value.stderr_tail) == "worker: giving up"
    assert after["twice"] == 4 and after["pid"] != first["pid"] and w.started == 2


def test_json_worker_that_hangs_is_killed_at_the_deadline() -> None:
    with proc.JsonWorker([sys.executable, "-c", JSON_WORKER]) as w:
        w.ask({"n": 1}, timeout=30)
        with pytest.raises(CommandTimeout) as hung:
            w.ask({"do": "hang"}, timeout=0.5)
        assert hung.value.timeout == 0.5
        assert w.ask({"n": 3}, timeout=30)["twice"] == 6
    assert w.started == 2


def test_json_worker_answer_that_is_not_an_object_is_a_failure() -> None:
    with proc.JsonWorker([sys.executable, "-c", JSON_WORKER]) as w:
        with pytest.raises(WorkerOutputError) as bad:
            w.ask({"do": "noise"}, timeout=30)
        assert last_line(bad.value.stderr_tail) == (
            "printed no JSON result (last line on stdout: [1, 2])"
        )
        assert w.ask({"n": 4}, timeout=30)["twice"] == 8
    assert w.started == 2


def test_workers_find_the_virtualenvs_own_tools_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the caller's PATH (a shell without the virtualenv active, an ssh login), a
    worker finds the virtualenv's ninja first: torch builds DeepSpeed's ops with the first
    ninja on PATH, and one of another version rebuilds them all."""
    here = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")
    assert proc.worker_env()["PATH"] == f"{here}:/usr/local/bin:/usr/bin:/bin"
    monkeypatch.setenv("PATH", f"{here}:/usr/bin")
    assert "PATH" not in proc.worker_env()  # already first: left as it is
