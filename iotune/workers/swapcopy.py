"""The copy of an NVMe-offloaded optimizer's swap files that a DeepSpeed checkpoint makes, at
the drives' speed.

DeepSpeed's ``save_checkpoint`` copies the optimizer's swap folder into the checkpoint
(``TAG/offloaded_tensors/rankRR``) with ``shutil.copytree``, and ``load_checkpoint`` copies it
back the same way (runtime/engine.py): through the page cache, one file at a time, whatever
checkpoint writer is chosen. Within ``swap_copies(COPY)`` those two copies go another way:

- ``aio``: O_DIRECT reads from the swap folder and writes into the checkpoint through
  DeepSpeed's own async I/O op, two page-locked buffers in turn, so that one chunk is read
  while the one before it is written, each request split over the op's threads;
- ``reflink``: each file cloned (``FICLONE``): where the checkpoint is on the swap folder's
  file system and it clones (XFS with reflink, btrfs), the copy shares the swap files'
  extents, and later writes to the swap files copy them on write; refused in one line
  where the file system cannot clone;
- ``deepspeed``: DeepSpeed's own ``shutil.copytree``, as without iotune.

Whichever runs, the copy is durable before DeepSpeed goes on: each file's data, then the
folders, bottom up. Within ``swap_copies`` a save also keeps the order a crash cannot break
(``durable_save``): every file of the tag folder durable, then its folders, and only then
``latest``, replaced atomically; killed or powered off at any point, ``latest`` names a
checkpoint that is whole. The copies other than of the swap folder (none today) go to
``shutil.copytree`` unchanged.

In your own script, around DeepSpeed's calls::

    from iotune.workers.swapcopy import swap_copies

    with swap_copies("aio"):
        engine.save_checkpoint(save_dir, tag)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iotune.workers.durable import durable_save, fsync_path, preallocate

COPIES = ("aio", "reflink", "deepspeed")
#: linux/fs.h: _IOW(0x94, 9, int)
FICLONE = 0x40049409
#: the folder of the swap files' copy inside a checkpoint's tag folder
OFFLOADED = "offloaded_tensors"
#: the O_DIRECT unit: a request's offset and length are multiples of it (the largest logical
#: block size of a drive, 4 KiB); a file's tail past the last whole unit is copied through the
#: page cache and made durable with the rest
ALIGN = 4096


#: shutil's own copytree, whatever swap_copies puts in its place
_COPYTREE = shutil.copytree


class CopyError(Exception):
    """A copy that cannot be made, for a reason the message gives in one line."""


@dataclass
class CopyRecord:
    """What one copy of a swap folder did: the records a run keeps (``copies``)."""

    copy: str
    source: str
    target: str
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    #: seconds to make the copy durable (fsync of every file and folder), within ``seconds``
    durable_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "copy": self.copy,
            "source": self.source,
            "target": self.target,
            "files": self.files,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 4),
            "durable_s": round(self.durable_s, 4),
        }


@dataclass
class AioSettings:
    """The async I/O op's settings for the copy (a sweep's best, or DeepSpeed's defaults)."""

    block_size: int = 1 << 20
    queue_depth: int = 32
    intra_op_parallelism: int = 4
    #: bytes of each of the two page-locked buffers; a multiple of ALIGN x the threads
    chunk: int = 64 << 20
    single_submit: bool = False
    overlap_events: bool = True

    def checked(self) -> AioSettings:
        unit = ALIGN * self.intra_op_parallelism
        if self.chunk < unit or self.chunk % unit:
            raise CopyError(
                f"the copy's chunk, {self.chunk} bytes, is not a multiple of {unit} "
                f"({ALIGN} bytes x {self.intra_op_parallelism} threads)"
            )
        return self


def settings_of(aio: dict[str, Any] | None) -> AioSettings:
    """The copy's settings from a DeepSpeed config's ``aio`` section (the run's, a sweep's
    best where it was given one): its block, queue depth and threads, the chunk the largest
    multiple of ALIGN x the threads up to 64 MiB."""
    aio = aio or {}
    threads = int(aio.get("intra_op_parallelism", aio.get("thread_count", 1)) or 1)
    unit = ALIGN * threads
    return AioSettings(
        block_size=int(aio.get("block_size", 1 << 20)),
        queue_depth=int(aio.get("queue_depth", 32)),
        intra_op_parallelism=threads,
        chunk=max(unit, (64 << 20) // unit * unit),
        single_submit=bool(aio.get("single_submit", False)),
        overlap_events=bool(aio.get("overlap_events", True)),
    )


def copies(copy: str | None, aio: dict[str, Any] | None) -> Any:
    """``swap_copies`` for a run's *copy*; for ``deepspeed`` (or none) nothing in
    DeepSpeed's way: its own copy, as without iotune. iotune's worker orders its saves
    itself, whatever the copy (iotune.workers.checkpoints)."""
    if not copy or copy == "deepspeed":
        return contextlib.nullcontext([])
    return swap_copies(copy, settings_of(aio), order_saves=False)


@dataclass
class _Walk:
    files: list[tuple[Path, Path]] = field(default_factory=list)
    dirs: list[Path] = field(default_factory=list)


def _walk(src: Path, dst: Path, ignore: Callable[[str, list[str]], Any] | None) -> _Walk:
    """The files to copy and the folders to make, as ``shutil.copytree`` would with *ignore*."""
    out = _Walk()
    for root, dirs, names in os.walk(src):
        skip = set(ignore(root, [*dirs, *names])) if ignore else set()
        dirs[:] = sorted(d for d in dirs if d not in skip)
        rel = Path(root).relative_to(src)
        out.dirs.append(dst / rel)
        for n in sorted(names):
            if n not in skip:
                out.files.append((Path(root) / n, dst / rel / n))
    return out


def chunks(size: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, length) of each piece of *size* bytes, *chunk* bytes at most each."""
    return [(o, min(chunk, size - o)) for o in range(0, size, chunk)]


def _reflink(src: Path, dst: Path) -> None:
    with open(src, "rb") as fs, open(dst, "wb") as fd:
        try:
            fcntl.ioctl(fd.fileno(), FICLONE, fs.fileno())
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY):
                raise CopyError(
                    "they are on different file systems"
                    if e.errno == errno.EXDEV
                    else f"{dst.parent}'s file system does not clone files (XFS with reflink, "
                    "btrfs do)"
                ) from None
            raise


def _buffered_tail(src: Path, dst: Path, start: int, size: int) -> None:
    """Bytes *start*..*size* of *src* into *dst* through the page cache."""
    if start >= size:
        return
    with open(src, "rb") as fs, open(dst, "r+b") as fd:
        fs.seek(start)
        fd.seek(start)
        shutil.copyfileobj(fs, fd, 8 << 20)


class _AioCopier:
    """Two handles of DeepSpeed's async I/O op (one reads, one writes) and two page-locked
    buffers: chunk i is written while chunk i+1 is read, from one file to the next too (a
    file's last write goes on while the next file's first chunk is read; :meth:`finish`
    waits for the last one)."""

    def __init__(self, settings: AioSettings) -> None:
        import torch
        from deepspeed.ops.op_builder import AsyncIOBuilder

        self.s = settings.checked()
        op = AsyncIOBuilder().load(verbose=False)
        args = (
            settings.block_size,
            settings.queue_depth,
            settings.single_submit,
            settings.overlap_events,
            settings.intra_op_parallelism,
        )
        self.read, self.write = op.aio_handle(*args), op.aio_handle(*args)
        like = torch.empty(0, dtype=torch.uint8)
        self.bufs = [self.read.new_cpu_locked_tensor(settings.chunk, like) for _ in range(2)]
        self.turn = 0  # the buffer the next chunk is read into
        self.pending: Path | None = None  # the file the write in flight goes to

    def close(self) -> None:
        if self.pending is not None:  # a copy cut short: its write done before its buffer goes
            self.pending = None
            self.write.wait()
        for b in self.bufs:
            self.read.free_cpu_locked_tensor(b)
        self.bufs = []

    def finish(self) -> None:
        """The write in flight done (its file's data is then with the drive's cache: the
        caller fsyncs)."""
        if self.pending is not None:
            dst, self.pending = self.pending, None
            if self.write.wait() < 0:
                raise CopyError(f"the async I/O op could not write {dst}")

    def copy(self, src: Path, dst: Path) -> int:
        size = src.stat().st_size
        unit = ALIGN * self.s.intra_op_parallelism
        direct = size - size % unit
        # the target exists, its blocks allocated, before the first write (the op opens
        # without O_TRUNC; a write past the end would wait for its completion: durable.py)
        with open(dst, "wb") as fh:
            preallocate(fh.fileno(), size)
        s, d = str(src), str(dst)
        for off, n in chunks(direct, self.s.chunk):
            buf = self.bufs[self.turn][:n]
            if self.read.pread(buf, s, False, False, off) < 0:
                raise CopyError(f"the async I/O op could not read {src} at {off}")
            self.finish()  # the write before, from the other buffer
            if self.write.pwrite(buf, d, False, True, off) < 0:
                raise CopyError(f"the async I/O op could not write {dst} at {off}")
            self.pending, self.turn = dst, 1 - self.turn
        if direct < size:
            self.finish()
            _buffered_tail(src, dst, direct, size)
            os.truncate(dst, size)
        return size


def copy_tree(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    copy: str,
    *,
    ignore: Callable[[str, list[str]], Any] | None = None,
    dirs_exist_ok: bool = False,
    settings: AioSettings | None = None,
) -> CopyRecord:
    """Copy folder *src* into *dst* by *copy* (COPIES), durable when it returns: every file's
    data, then every folder bottom up, then *dst*'s parent."""
    if copy not in COPIES:
        raise CopyError(f"unknown copy {copy!r}: one of {', '.join(COPIES)}")
    source, target = Path(src), Path(dst)
    rec = CopyRecord(copy, str(source), str(target))
    t0 = time.perf_counter()
    if copy == "deepspeed":
        _COPYTREE(source, target, ignore=ignore, dirs_exist_ok=dirs_exist_ok)
        walk = _walk(target, target, None)
        rec.files = len(walk.files)
        rec.bytes = sum(f.stat().st_size for f, _ in walk.files)
    else:
        if target.exists() and not dirs_exist_ok:
            raise FileExistsError(errno.EEXIST, "File exists", str(target))
        walk = _walk(source, target, ignore)
        for d in walk.dirs:
            d.mkdir(parents=True, exist_ok=True)
        copier = _AioCopier(settings or AioSettings()) if copy == "aio" else None
        try:
            for f, t in walk.files:
                if copier is not None:
                    rec.bytes += copier.copy(f, t)
                else:
                    try:
                        _reflink(f, t)
                    except CopyError as e:
                        raise CopyError(f"cannot clone {f} into {t.parent}: {e}") from None
                    rec.bytes += t.stat().st_size
                rec.files += 1
            if copier is not None:
                copier.finish()
        finally:
            if copier is not None:
                copier.close()
    t1 = time.perf_counter()
    for _, t in walk.files:
        fsync_path(t)
    for d in reversed(walk.dirs):
        fsync_path(d, directory=True)
    fsync_path(target.parent, directory=True)
    rec.durable_s = time.perf_counter() - t1
    rec.seconds = time.perf_counter() - t0
    return rec


def clone_problem(src: Path, dst: Path) -> str | None:
    """Why a file in folder *src* cannot be cloned into folder *dst* (None: it can), by
    trying: a 4 KiB probe file made in *src*, cloned into *dst*, both removed."""
    made: list[Path] = []
    try:
        with tempfile.NamedTemporaryFile(dir=src, prefix=".iotune-clone-", delete=False) as fh:
            made.append(Path(fh.name))
            fh.write(b"\0" * ALIGN)
            fh.flush()
            os.fsync(fh.fileno())
        target = dst / (made[0].name + ".clone")
        made.append(target)
        _reflink(made[0], target)
    except CopyError as e:
        return str(e)
    except OSError as e:
        return f"a clone could not be tried: {e.strerror or e}"
    finally:
        for f in made:
            f.unlink(missing_ok=True)
    return None


def is_swap_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> bool:
    """DeepSpeed's copy of a swap folder: into a checkpoint's ``offloaded_tensors/rankRR``
    (a save) or out of one (a load)."""
    for p in (Path(src), Path(dst)):
        if p.parent.name == OFFLOADED and p.name.startswith("rank"):
            return True
    return False


@contextlib.contextmanager
def swap_copies(
    copy: str = "aio", settings: AioSettings | None = None, order_saves: bool = True
) -> Iterator[list[CopyRecord]]:
    """Within it, DeepSpeed's copies of its swap folder (``save_checkpoint``'s and
    ``load_checkpoint``'s) go by *copy*; the list it gives holds a record of each. With
    *order_saves*, each ``save_checkpoint`` also ends as durable_save orders it."""
    if copy not in COPIES:
        raise CopyError(f"unknown copy {copy!r}: one of {', '.join(COPIES)}")
    if settings is not None:
        settings.checked()
    records: list[CopyRecord] = []
    real = shutil.copytree  # another's patch, if any, for the copies that are not ours

    def copytree(src: Any, dst: Any, *args: Any, **kw: Any) -> Any:
        if args or not is_swap_copy(src, dst) or set(kw) - {"ignore", "dirs_exist_ok"}:
            return real(src, dst, *args, **kw)
        records.append(copy_tree(src, dst, copy, settings=settings, **kw))
        return dst

    shutil.copytree = copytree  # DeepSpeed imports it from shutil at each save and load
    engine_cls = _engine_class() if order_saves else None
    if engine_cls is not None:
        real_save = engine_cls.save_checkpoint

        def save_checkpoint(self: Any, save_dir: Any, *args: Any, **kw: Any) -> Any:
            names = ("tag", "client_state", "save_latest", "exclude_frozen_parameters")
            kw.update(zip(names, args, strict=False))
            return durable_save(self, save_dir, save=real_save, **kw)[0]

        engine_cls.save_checkpoint = save_checkpoint
    try:
        yield records
    finally:
        shutil.copytree = real
        if engine_cls is not None:
            engine_cls.save_checkpoint = real_save


def _engine_class() -> Any:
    """DeepSpeed's engine class where the script imported it (None: no save to order)."""
    mod = sys.modules.get("deepspeed.runtime.engine")
    return getattr(mod, "DeepSpeedEngine", None)
