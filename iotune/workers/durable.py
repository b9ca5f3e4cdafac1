"""A save made durable in the order a crash cannot break, and files laid out before O_DIRECT
writes fill them.

- ``seal`` / ``durable_save``: every file of a checkpoint's tag folder durable, then its
  folders bottom up, then the parent, and only then DeepSpeed's ``latest``, replaced
  atomically (``write_latest``). Killed or powered off at any point, ``latest`` names a
  checkpoint that is whole.
- ``preallocate``: a file's blocks allocated (``fallocate``) before O_DIRECT writes fill it.
  ext4 runs a direct write past the end of the file synchronously under the inode's
  exclusive lock (fs/ext4/file.c, ``ext4_dio_write_checks``: an extending write waits for
  its completion), so async I/O into a new, empty file has one request in flight at a time,
  whatever the queue depth; into allocated blocks the writes go in parallel.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: DeepSpeed's file in a checkpoint folder that names the tag to load
LATEST = "latest"

_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_LIBC.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)


def preallocate(fd: int, size: int) -> bool:
    """The file *fd* *size* bytes long with its blocks allocated, by fallocate(2) (never
    glibc's posix_fallocate, which writes a byte a block where the file system cannot).
    False where the file system cannot allocate ahead: the file is then only made *size*
    long (ftruncate), which also keeps the writes from extending it."""
    if size <= 0:
        return True
    if _LIBC.fallocate(fd, 0, 0, size) == 0:
        return True
    err = ctypes.get_errno()
    if err not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        raise OSError(err, os.strerror(err))
    os.ftruncate(fd, size)
    return False


def fsync_path(path: Path, directory: bool = False) -> None:
    """fsync a file (or, *directory*, a folder's entries)."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> dict[str, int]:
    """fsync every file under *path*, then each folder bottom up and *path*'s own parent:
    what a save left durable, and how many bytes (the .swp files apart: the swap files'
    copy). After DeepSpeed's save_checkpoint (a barrier ends it) every rank's files are
    there: the figures are the tag folder's, not one rank's share."""
    files = copied = written = 0
    dirs: list[str] = []
    for root, _, names in os.walk(path):
        dirs.append(root)
        for n in names:
            f = os.path.join(root, n)
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            files += 1
            written += size
            if n.endswith(".swp"):
                copied += size
    for d in reversed(dirs):
        fsync_path(Path(d), directory=True)
    fsync_path(path.parent, directory=True)
    return {"files": files, "bytes": written, "swap_copy_bytes": copied}


def write_latest(save_dir: Path, tag: str) -> None:
    """DeepSpeed's ``latest`` file naming *tag*, atomically and durably: written beside it,
    made durable, renamed over it, the folder made durable. A crash at any point leaves
    ``latest`` naming the checkpoint before or this one, never a torn name."""
    tmp = save_dir / f".{LATEST}.iotune-new"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, tag.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, save_dir / LATEST)
    fsync_path(save_dir, directory=True)


def seal(save_dir: Path, tag: str, latest: bool) -> dict[str, int]:
    """A save's end, in the order a crash cannot break: the tag folder durable, then latest."""
    held = fsync_tree(save_dir / tag)
    if latest:
        write_latest(save_dir, tag)
    return held


def durable_save(
    engine: Any,
    save_dir: str | os.PathLike[str],
    tag: Any = None,
    client_state: dict[str, Any] | None = None,
    save_latest: bool = True,
    save: Callable[..., Any] | None = None,
    **kw: Any,
) -> tuple[Any, dict[str, int]]:
    """DeepSpeed's ``save_checkpoint`` in the order a crash cannot break: the tag folder's
    files, then its folders, made durable, and only then ``latest`` (write_latest), which
    DeepSpeed itself writes through the page cache before anything is durable. The decoupled
    writer commits after the call returns; its save is left to DeepSpeed's order. *save*:
    the unbound save_checkpoint to call (DeepSpeed's, where swap_copies replaced it)."""
    save = save or type(engine).save_checkpoint
    if tag is None:  # DeepSpeed's own default
        tag = f"global_step{engine.global_steps}"
    tag = str(tag)
    state = {} if client_state is None else client_state
    if engine.checkpoint_engine.is_decoupled():
        out = save(engine, save_dir, tag=tag, client_state=state, save_latest=save_latest, **kw)
        return out, {}
    out = save(engine, save_dir, tag=tag, client_state=state, save_latest=False, **kw)
    return out, seal(Path(save_dir), tag, save_latest and engine.global_rank == 0)
