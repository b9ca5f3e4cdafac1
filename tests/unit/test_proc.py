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


def test_missing_tool_names_the_package() -> None:
    with pytest.raises(ToolMissing) as info:
        proc.run(["iotune-no-such-tool-xyz"])
    assert "iotune-no-such-tool-xyz is not installed" in info.value.message
    assert info.value.hint and "apt-get install" in info.value.hint


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
