"""DeepSpeed's JIT-built ops: whether one is built for this DeepSpeed, and loading those
that are (the zygote, iotune/workers/zygote.py, loads them once for every worker it forks).
Imported, never run as a worker."""

from __future__ import annotations

import glob
import os
import time
from typing import Any


def built(builder: Any) -> dict[str, Any]:
    """Whether DeepSpeed's JIT op *builder* is built in torch's extension cache for this
    DeepSpeed (``built``, ``build_dir``; ``stale`` where another install built it)."""
    import deepspeed
    from torch.utils.cpp_extension import _get_build_directory

    build_dir = _get_build_directory(builder.name, verbose=False)
    out: dict[str, Any] = {"built": bool(glob.glob(os.path.join(build_dir, "*.so")))}
    out["build_dir"] = build_dir
    ninja = os.path.join(build_dir, "build.ninja")
    if out["built"] and os.path.exists(ninja):
        # built from another DeepSpeed install (another virtualenv): loading it would
        # rebuild it first, which takes minutes; say so instead of doing it
        with open(ninja) as fh:
            if os.path.dirname(deepspeed.__file__) not in fh.read():
                out["built"] = False
                out["stale"] = True
    return out


#: the file torch's extension loader creates in an op's build folder while one process builds
#: or checks it (torch.utils.file_baton.FileBaton); every other loader waits while it exists
LOCK = "lock"


def lock_holders(path: str, proc: str = "/proc") -> list[int] | None:
    """The processes that have the file *path* open (torch's builder keeps its lock open until
    it removes it), by the kernel's own table; None where a process's open files cannot be
    read (not root), so that no answer is a guess."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return []
    held, unknown = [], False
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        fds = os.path.join(proc, pid, "fd")
        try:
            names = os.listdir(fds)
        except FileNotFoundError:
            continue  # ended meanwhile
        except PermissionError:
            unknown = True
            continue
        for fd in names:
            try:
                other = os.stat(os.path.join(fds, fd))
            except OSError:
                continue  # closed meanwhile, or not a file
            if (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino):
                held.append(int(pid))
                break
    return None if unknown and not held else held


def free_stale_lock(build_dir: str, proc: str = "/proc") -> str | None:
    """Remove torch's build lock in *build_dir* where no process holds it: a build that was
    stopped (Ctrl-C, a kill) leaves it behind, and every later load of that op would wait on
    it forever without a word. What was done, as a line for the user; None where there is no
    lock."""
    path = os.path.join(build_dir, LOCK)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    holders = lock_holders(path, proc)
    if holders is None:
        return f"waiting on {path}: this user cannot see whether a build holds it"
    if holders:
        return f"waiting on the build of process {holders[0]}, which holds {path}"
    try:
        again = os.stat(path)
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):
            return None  # released and taken again meanwhile: a live build's
        os.unlink(path)
    except FileNotFoundError:
        return None
    except OSError as exc:  # the op's load still waits on it: said, not raised
        return f"waiting on {path}, left by a stopped build: it cannot be removed ({exc.strerror})"
    return f"removed {path}: a build that was stopped left it, and no process holds it"


def load_quietly(names: tuple[str, ...], build: bool = False) -> dict[str, float]:
    """Load each op of *names* that this accelerator has and can load: those built already,
    and with *build* those it builds now (minutes the first time). Nothing is raised: a
    run's own check loads it again and reports. The seconds each took, by op name."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    took = {}
    for name in names:
        try:
            builder = acc.create_op_builder(name)
            if builder is None:
                continue
            cache = built(builder)
            if not (build or cache["built"]):
                continue
            free_stale_lock(cache["build_dir"])
            t0 = time.monotonic()
            builder.load(verbose=False)
        except Exception:  # noqa: BLE001, S112 - the run's own check loads it and reports
            continue
        took[builder.name] = round(time.monotonic() - t0, 3)
    return took
