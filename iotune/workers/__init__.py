"""Code that imports torch or DeepSpeed runs here, each in its own process, so a crash, a hang
or CUDA state costs one record, not the caller."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any, TextIO


def stdout_to_stderr() -> None:
    """Point fd 1 at stderr: torch, DeepSpeed, its compiler checks and the child processes they
    start print there freely, and the caller reads the worker's stdout (or keeps it for --json)."""
    os.dup2(2, 1)


def private_stdout() -> TextIO:
    """The original stdout, kept for the worker's one JSON report, with fd 1 sent to stderr."""
    report = os.fdopen(os.dup(1), "w")
    stdout_to_stderr()
    return report


def report_json_request(work: Callable[[Any], dict[str, Any]]) -> None:
    """A worker's main: stdout kept for its one JSON report, the request read from the JSON
    file named by argv[1], and *work*'s answer to it reported."""
    report = private_stdout()
    with open(sys.argv[1]) as fh:
        req = json.load(fh)
    report.write(json.dumps(work(req)) + "\n")
    report.flush()


def die_with_parent() -> None:
    """SIGTERM this worker when the iotune process that started it dies (a kill -9, a
    crash): a training worker left running would go on writing swap files that a resumed
    study removes. Linux prctl(PR_SET_PDEATHSIG); the parent may already be gone."""
    import ctypes
    import signal

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


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


#: this process's origin: set in a worker the zygote has just forked
_origin = {"forked": False}


def mark_forked() -> None:
    """Called in a worker the zygote has just forked (iotune/workers/zygote.py)."""
    _origin["forked"] = True


def forked() -> bool:
    """Whether this process is a worker the zygote forked: its RSS then leaves out the pages
    of the zygote's imports that it has not touched itself."""
    return _origin["forked"]


def command(module: str, *args: str) -> list[str]:
    """How to start worker *module* (``python -m MODULE ARGS``), or, where ``$IOTUNE_ZYGOTE``
    names a zygote's socket, its client, which forks the worker from a process that has
    imported torch and DeepSpeed already (iotune/workers/zygote.py); a client that finds no
    server there starts the worker itself."""
    return [sys.executable, "-m", *module_args(module, *args)]


def module_args(module: str, *args: str) -> list[str]:
    """What follows ``python -m`` in ``command``: for a launcher that starts the Python
    module itself (DeepSpeed's ``--module``)."""
    sock = os.environ.get(ZYGOTE_ENV)
    if sock and os.path.exists(sock):
        return ["iotune.workers.zygote", "client", sock, module, *args]
    return [module, *args]
