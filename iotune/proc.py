"""The one process gateway: every external program iotune starts goes through :func:`run`
(or, for long-running ones, :func:`spawn` and :class:`JsonWorker`).

argv lists only (never a shell), a timeout on every call, the exact command logged under
``--debug``, and failures raised as typed errors carrying argv, exit code and stderr tail.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shlex
import shutil
import subprocess
import sys
import tempfile
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
    "ip": "iproute2",
    "nvme": "nvme-cli",
    "ssh": "openssh-client",
    "pdsh": "pdsh",
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


def pid_alive(pid: int) -> bool:
    """Whether process *pid* exists (another user's included): for what a killed process
    left behind, named by its pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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


class JsonWorker:
    """A long-running worker spoken to in JSON lines: one request object per line on its
    stdin, one result object per line on its stdout. Started at the first :meth:`ask` and
    again after a failure, so a worker that dies, hangs or fails costs the request in
    flight and nothing else; its stderr is kept (in a file, never a full pipe) for the
    error's tail. Same rules as :func:`run`: argv only, logged under ``--debug``, a
    deadline on every request, typed errors."""

    def __init__(self, argv: Sequence[str | Path], env: Mapping[str, str] | None = None) -> None:
        self.argv = _resolve(argv)
        self.env = {**os.environ, **(env or {})}
        self._p: subprocess.Popen[bytes] | None = None
        self._err: Any = None
        self._buf = b""
        self.started = 0  # how many processes it took (1 while nothing failed)

    def _start(self) -> subprocess.Popen[bytes]:
        if self._p is None:
            log.debug("spawn: %s", shlex.join(self.argv))
            if self._err is not None:
                self._err.close()
            self._err = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the worker)
            self._buf = b""
            try:
                self._p = subprocess.Popen(
                    self.argv,
                    env=self.env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=self._err,
                )
            except OSError as exc:
                raise CannotExecute(self.argv[0], exc.strerror or str(exc)) from exc
            self.started += 1
        return self._p

    def _tail(self) -> str:
        """The last of the current (or last) process's stderr."""
        if self._err is None:
            return ""
        self._err.seek(0, os.SEEK_END)
        size = self._err.tell()
        self._err.seek(max(0, size - STDERR_TAIL_CHARS))
        return str(self._err.read().decode(errors="replace"))

    def _line(self, fd: int, deadline: float) -> bytes | None:
        """The next stdout line; None at end of file; TimeoutError past *deadline*."""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def ask(self, request: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        """Send *request*, return the worker's answer; CommandTimeout after *timeout*
        seconds, CommandFailed when the worker dies or answers something else (the
        worker is stopped then, and the next request starts a fresh one)."""
        p = self._start()
        if p.stdin is None or p.stdout is None:
            raise RuntimeError("worker started without pipes")
        start = time.monotonic()
        line: bytes | None = None
        try:
            p.stdin.write(json.dumps(request).encode() + b"\n")
            p.stdin.flush()
            line = self._line(p.stdout.fileno(), start + timeout)
        except TimeoutError:
            self.close(kill=True)
            raise CommandTimeout(self.argv, timeout, self._tail()) from None
        except BrokenPipeError:
            pass  # it died before reading: its exit code and stderr say why
        try:
            value = json.loads(line) if line is not None else None
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            code = self.close(kill=line is not None)
            if line is not None:  # it answered, but not with a JSON object
                raise WorkerOutputError(
                    self.argv, code, line.decode(errors="replace"), self._tail()
                )
            raise CommandFailed(self.argv, code, self._tail())
        log.debug("answer after %.2f s from %s", time.monotonic() - start, self.argv[-1])
        return value

    def close(self, kill: bool = False, grace: float = 10.0) -> int:
        """End the worker (end of its input, then SIGKILL after *grace* seconds, or at
        once with *kill*) and return its exit code; 0 when none was running."""
        p, self._p = self._p, None
        if p is None:
            return 0
        if kill:
            p.kill()
        if p.stdin is not None:
            with contextlib.suppress(OSError):
                p.stdin.close()
        try:
            code = p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            code = p.wait()
        if p.stdout is not None:
            p.stdout.close()
        return code

    def release(self) -> None:
        """Drop the kept stderr of the last process (after :meth:`close`)."""
        if self._err is not None:
            self._err.close()
            self._err = None

    def __enter__(self) -> JsonWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self.release()


# ------------------------------------------------------------------ the workers


def worker_env() -> dict[str, str]:
    """Environment for workers: DeepSpeed's JIT-built ops cached per virtualenv.

    torch caches extensions in ~/.cache/torch_extensions/<python>_<cuda>/ by default; two
    virtualenvs then rebuild each other's async_io op (minutes each time) because its
    build file names the other install's sources. A user's TORCH_EXTENSIONS_DIR wins.
    """
    env = {}
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        env["TORCH_EXTENSIONS_DIR"] = os.path.join(sys.prefix, "var", "torch_extensions")
    env.update(compiler_cache())
    # the virtualenv's own tools first, as an activated one has them: torch builds the ops
    # with the first ninja on PATH, and a system ninja of another version discards the
    # virtualenv's build log (ninja's log format) and rebuilds every op, minutes each time
    # the caller's PATH changes (a shell with the virtualenv active, one without, ssh)
    here = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != here:
        env["PATH"] = os.pathsep.join([here, path]) if path else here
    return env


def compiler_cache() -> dict[str, str]:
    """Make ccache share DeepSpeed's op builds between virtualenvs.

    torch's JIT compiles through ccache when it is on PATH (cpp_extension._wrap_compiler).
    A new virtualenv holds new copies of DeepSpeed's sources, so every op is built again
    (minutes on a small host); relative to the virtualenv the build is the same, and ccache,
    told that paths below it are relative (CCACHE_BASEDIR) and not to hash the build
    folder, finds every object an earlier virtualenv compiled. A user's settings win."""
    if shutil.which("ccache") is None:
        return {}
    env = {"CCACHE_BASEDIR": sys.prefix, "CCACHE_NOHASHDIR": "1"}
    return {k: v for k, v in env.items() if k not in os.environ}


#: names a running ``python -m iotune.workers.zygote serve SOCKET``: workers fork from it
ZYGOTE_ENV = "IOTUNE_ZYGOTE"


def command(module: str, *args: str) -> list[str]:
    """How to start worker *module* (``python -m MODULE ARGS``), or, where ``$IOTUNE_ZYGOTE``
    names a zygote's socket, its client, which forks the worker from a process that has
    imported torch and DeepSpeed already (iotune/workers/zygote.py); a client that finds no
    server there starts the worker itself."""
    return [sys.executable, "-m", *module_args(module, *args)]


def module_args(module: str, *args: str) -> list[str]:
    """What follows ``python -m`` in ``command``: for a launcher that starts the Python
    module itself (DeepSpeed's ``--module``)."""
    sock = zygote_socket()
    if sock:
        return ["iotune.workers.zygote", "client", sock, module, *args]
    return [module, *args]


def zygote_socket() -> str | None:
    """The socket of the zygote that serves this host's workers (``$IOTUNE_ZYGOTE``), or
    None where it names none that exists."""
    sock = os.environ.get(ZYGOTE_ENV)
    return sock if sock and os.path.exists(sock) else None


def run_worker(
    module: str, *args: str, timeout: float, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run worker *module* (iotune/workers/) with *args* and return its JSON report: the one
    way every layer calls a worker."""
    done = run(command(module, *args), timeout=timeout, env={**worker_env(), **(env or {})})
    return worker_json(done)
