"""Code that imports torch or DeepSpeed runs here, each in its own process, so a crash, a hang
or CUDA state costs one record, not the caller.

May import: iotune.trace, iotune.proc, and torch, DeepSpeed and transformers inside the
process. Nothing above it: they are started by name (`python -m iotune.workers.NAME`)."""

from __future__ import annotations

import functools
import json
import os
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


def cpu_info_once() -> None:
    """py-cpuinfo's ``get_cpu_info``, which DeepSpeed asks twice for each op it loads (its
    compiler flags) and once for each CPU Adam it makes, starts a Python process each time:
    1.27 s on an AVX2 host, many times that in an emulated guest. The CPU does not change
    under a process: from here its first answer is kept, and a zygote's is kept for every
    worker it forks."""
    try:
        import cpuinfo
    except ImportError:
        return
    ask = cpuinfo.get_cpu_info
    if isinstance(ask, functools._lru_cache_wrapper):
        return
    cpuinfo.get_cpu_info = functools.lru_cache(maxsize=1)(ask)


#: this process's origin: set in a worker the zygote has just forked
_origin = {"forked": False}


def mark_forked() -> None:
    """Called in a worker the zygote has just forked (iotune/workers/zygote.py)."""
    _origin["forked"] = True


def forked() -> bool:
    """Whether this process is a worker the zygote forked: its RSS then leaves out the pages
    of the zygote's imports that it has not touched itself."""
    return _origin["forked"]
