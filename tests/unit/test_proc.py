import pytest

from iotune import proc
from iotune.errors import CommandFailed, CommandTimeout, ToolMissing


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
