"""One error hierarchy for everything a user can see.

Every user-facing failure is an :class:`IotuneError`: it prints one line saying what went
wrong and, where there is one, a hint line saying what to do. Exit code 1 is a runtime
failure, 2 a usage error (click's convention). Tracebacks appear only with ``--debug``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

import click


def last_line(text: str) -> str | None:
    """The last line of a program's (or an exception's) error output; None when it is empty.
    A program that prints its usage after the error (mkfs.xfs: "Log size must be at least
    64MB." and then its whole usage) is told by the line before "Usage:"."""
    lines = [line.strip() for line in text.strip().splitlines()]
    usage = next((i for i, line in enumerate(lines) if line.lower().startswith("usage:")), None)
    if usage is not None and usage > 0:  # usage first (argparse): the error comes after it
        lines = lines[:usage]
    lines = [line for line in lines if line]
    return lines[-1] if lines else None


class IotuneError(click.ClickException):
    """A failure the user can act on: a message and an optional hint."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def format_message(self) -> str:
        return self.message

    def show(self, file: object = None) -> None:
        click.echo(f"iotune: error: {self.message}", err=True)
        if self.hint:
            click.echo(f"hint: {self.hint}", err=True)


class UsageError(IotuneError):
    """Bad input: an option value, a path or a device that does not make sense."""

    exit_code = 2


class NotRootError(IotuneError):
    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} needs root",
            hint="run it as root, e.g. 'sudo iotune ...' (the probes open block devices "
            "and load BPF programs)",
        )


class DeviceNotFound(UsageError):
    def __init__(self, device: str) -> None:
        super().__init__(
            f"no block device {device!r}",
            hint="'iotune devices --all' lists every disk this host has",
        )


class ToolMissing(IotuneError):
    """An external program is not installed."""

    def __init__(self, tool: str, package: str | None = None) -> None:
        if "/" in tool:  # a path the user gave: nothing to install
            super().__init__(
                f"no such program: {tool}",
                hint="check the path; a script that is not executable runs as "
                f"'python3 {tool}' (or its own interpreter)",
            )
        elif package:
            super().__init__(
                f"{tool} is not installed",
                hint=f"install it with 'apt-get install {package}' (or run scripts/setup.sh)",
            )
        else:
            super().__init__(
                f"{tool} is not installed (not found on PATH)",
                hint="install it, or give its full path",
            )
        self.tool = tool


class CommandFailed(IotuneError):
    """An external program exited non-zero; carries argv, exit code and stderr tail."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr_tail: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        last = last_line(stderr_tail) or "no output"
        super().__init__(
            f"{shlex.join(self.argv)} failed with exit code {returncode}: {last}",
            hint="run with --debug to see every command and its full error output",
        )


class CommandTimeout(CommandFailed):
    def __init__(self, argv: Sequence[str], timeout: float, stderr_tail: str) -> None:
        IotuneError.__init__(
            self,
            f"{shlex.join(argv)} did not finish within {timeout:g} s",
            hint="the device may be hung or very slow; run with --debug for the command's output",
        )
        self.argv = list(argv)
        self.returncode = -1
        self.stderr_tail = stderr_tail
        self.timeout = timeout


class CannotExecute(IotuneError):
    """The program exists but the kernel would not start it (permissions, not an executable,
    wrong architecture): unlike ToolMissing, installing the package is not the remedy."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(
            f"cannot run {path}: {reason}",
            hint=f"check that {path} is an executable for this machine ('ls -l {path}', 'file {path}')",
        )
        self.path = path


class WorkerOutputError(CommandFailed):
    """A worker exited without the JSON result line it owes: recorded as a failure of that
    one point or run, never raised past the loop that started it."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr_tail: str) -> None:
        last_out = (last_line(stdout) or "nothing")[:200]
        super().__init__(
            argv,
            returncode,
            (stderr_tail.rstrip() + "\n" if stderr_tail.strip() else "")
            + f"printed no JSON result (last line on stdout: {last_out})",
        )


class ProbeError(IotuneError):
    """A sysfs/procfs fact could not be read or parsed."""
