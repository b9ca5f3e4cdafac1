"""The one process gateway: every external program iotune starts goes through :func:`run`.

argv lists only (never a shell), a timeout on every call, the exact command logged under
``--debug``, and failures raised as typed errors carrying argv, exit code and stderr tail.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iotune.errors import (
    CannotExecute,
    CommandFailed,
    CommandTimeout,
    ToolMissing,
    WorkerOutputError,
)

log = logging.getLogger("iotune.proc")

#: Debian/Ubuntu package that provides each program, for the "install it" hint.
PACKAGES: dict[str, str] = {
    "fio": "fio",
    "mdadm": "mdadm",
    "mkfs.xfs": "xfsprogs",
    "xfs_info": "xfsprogs",
    "mkfs.ext4": "e2fsprogs",
    "wipefs": "util-linux",
    "blkid": "util-linux",
    "losetup": "util-linux",
    "mount": "mount",
    "umount": "mount",
    "bpftool": "bpftool",
    "modprobe": "kmod",
    "udevadm": "udev",
    "nvidia-smi": "nvidia-utils",
}

STDERR_TAIL_CHARS = 2000


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def which(tool: str) -> str | None:
    """Path of *tool* on PATH or in the sbin directories a root shell would search."""
    found = shutil.which(tool)
    if found:
        return found
    extra = os.pathsep.join(["/usr/local/sbin", "/usr/sbin", "/sbin"])
    return shutil.which(tool, path=extra)


def _resolve(argv: Sequence[str | Path]) -> list[str]:
    """argv as strings with the program looked up, or ToolMissing naming its package."""
    args = [str(a) for a in argv]
    if not args:
        raise ValueError("empty argv")
    exe = args[0] if "/" in args[0] else which(args[0])
    if exe is None:
        raise ToolMissing(args[0], PACKAGES.get(args[0]))
    args[0] = exe
    return args


def run(
    argv: Sequence[str | Path],
    *,
    timeout: float = 60.0,
    check: bool = True,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Completed:
    """Run *argv* and return its output; raise a typed error on failure.

    ``check=False`` returns a non-zero exit as data instead of raising (for probes whose
    exit code is an answer, e.g. ``wipefs`` on a blank disk).
    """
    args = _resolve(argv)
    log.debug("run: %s", shlex.join(args))
    full_env = None
    if env is not None:
        full_env = dict(os.environ)
        full_env.update(env)
    start = time.monotonic()
    try:
        proc = subprocess.run(
            args,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            cwd=cwd,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        raise CommandTimeout(args, timeout, err[-STDERR_TAIL_CHARS:]) from exc
    except FileNotFoundError as exc:
        raise ToolMissing(args[0], PACKAGES.get(Path(args[0]).name)) from exc
    except OSError as exc:  # EACCES, ENOEXEC, ...: present but not runnable
        raise CannotExecute(args[0], exc.strerror or str(exc)) from exc
    seconds = time.monotonic() - start
    log.debug("exit %d after %.2f s: %s", proc.returncode, seconds, shlex.join(args))
    if proc.stderr:
        log.debug("stderr: %s", proc.stderr[-STDERR_TAIL_CHARS:].rstrip())
    done = Completed(tuple(args), proc.returncode, proc.stdout, proc.stderr, seconds)
    if check and proc.returncode != 0:
        raise CommandFailed(args, proc.returncode, proc.stderr[-STDERR_TAIL_CHARS:])
    return done


def spawn(
    argv: Sequence[str | Path],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdout_to_stderr: bool = False,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start a long-running workload with the terminal's stdin/stdout/stderr.

    ``stdout_to_stderr`` keeps the workload's output off our stdout (for ``--json``).

    The caller owns the process (waits for it, forwards signals). Same rules as :func:`run`:
    argv only, the exact command logged under ``--debug``, a typed error if it is missing.
    """
    args = _resolve(argv)
    log.debug("spawn: %s", shlex.join(args))
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        return subprocess.Popen(
            args,
            env=full_env,
            cwd=cwd,
            stdout=sys.stderr.fileno() if stdout_to_stderr else None,
            start_new_session=new_session,
        )
    except FileNotFoundError as exc:
        raise ToolMissing(args[0], PACKAGES.get(Path(args[0]).name)) from exc
    except OSError as exc:  # EACCES, ENOEXEC, ...: present but not runnable
        raise CannotExecute(args[0], exc.strerror or str(exc)) from exc


def worker_json(done: Completed) -> dict[str, Any]:
    """The JSON object a worker prints as its last stdout line; a worker that died or printed
    something else raises WorkerOutputError (a CommandFailed) instead of a parse error."""
    lines = done.stdout.strip().splitlines()
    try:
        value = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise WorkerOutputError(
            done.argv, done.returncode, done.stdout, done.stderr[-STDERR_TAIL_CHARS:]
        )
    return value
