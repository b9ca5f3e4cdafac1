import subprocess
import sys

import pytest

from iotune import proc
from iotune.errors import CommandFailed, CommandTimeout, ToolMissing, last_line


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
