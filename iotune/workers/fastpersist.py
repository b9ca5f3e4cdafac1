"""DeepSpeed's FastPersist checkpoint writers (``fast``, ``decoupled``): on a host without a
GPU, and their copy of each record timed, or skipped.

The writer's ``write`` turns each buffer torch.save hands it into a tensor with
``bytes_to_tensor`` (deepspeed/io/utils.py), ``torch.from_numpy(numpy.array(...))``: a copy
of the record in fresh memory, before the writer copies it again into its pinned buffer.
``RecordCopy`` times that function, or stands ``torch.frombuffer`` in for it, which reads
the record where it is (the writer only reads it).

DeepSpeed's writer factory (runtime/model_checkpointing/writer_factory.py) page-locks the
writer's I/O buffer with torch's ``Tensor.pin_memory``, which needs CUDA; and the writer
loads DeepSpeed's utils op, which its CPU accelerator refuses to build, though only the
legacy serialization calls it. Without a GPU, ``install()`` has the factory take the same
buffer from the aio op's page-locked allocator (``new_cpu_locked_tensor``, through the
handle it builds; the op keeps it for the process's life, as the factory keeps its buffer),
and the utils op loaded only when first called. The writer, the engines and the saves are
DeepSpeed's, unchanged. The decoupled engine saves in a process of its own: its target is
wrapped so that the child installs the same before DeepSpeed's own target runs, and dies
with the worker that started it. DeepSpeed starts that process with ``spawn`` (unless the
program chose a start method first), which a CUDA tensor shared with it needs; the spawned
child imports torch and DeepSpeed again (seconds on a server, minutes in an emulated CPU).
Without a GPU there is no CUDA tensor to share: the worker chooses ``fork`` and so forks it
instead, from the process that imported them once, and the child's torch keeps to one thread
(an OpenMP pool does not survive a fork).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

WHY = "locked by the aio op (no GPU)"


class LazyUtils:
    """DeepSpeed's utils op builder, loading (building) the op only when a function of it
    is first called."""

    def load(self) -> LazyUtils:
        return self

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            from deepspeed.ops.op_builder.utils import UtilsBuilder

            return getattr(UtilsBuilder().load(), name)(*args, **kwargs)

        return call


def _setup_for_aio(self: Any, aio_config: dict[str, Any]) -> None:
    """CheckpointWriterFactory._setup_for_aio with the buffer locked by the handle."""
    import torch
    from deepspeed.ops.op_builder import AsyncIOBuilder
    from deepspeed.runtime.swap_tensor import constants as c

    handle = (
        AsyncIOBuilder()
        .load(verbose=False)
        .aio_handle(
            block_size=aio_config[c.AIO_BLOCK_SIZE],
            queue_depth=aio_config[c.AIO_QUEUE_DEPTH],
            single_submit=aio_config[c.AIO_SINGLE_SUBMIT],
            overlap_events=aio_config[c.AIO_OVERLAP_EVENTS],
            intra_op_parallelism=aio_config[c.AIO_INTRA_OP_PARALLELISM],
        )
    )
    buf = handle.new_cpu_locked_tensor(self._io_buffer_size, torch.empty(0, dtype=torch.uint8))
    if buf.data_ptr() == 0:  # the op's allocator gives NULL where mlock fails
        raise RuntimeError(
            f"cannot lock {self._io_buffer_size} bytes for the checkpoint writer's buffer "
            "(RLIMIT_MEMLOCK: ulimit -l; root has CAP_IPC_LOCK)"
        )
    buf.zero_()
    self._io_buffer = buf
    self._dnvme_handle = handle


class RecordCopy:
    """The writer's ``bytes_to_tensor``, timed: DeepSpeed's own (a copy), or, *in_place*,
    the record read where it is; ``copied``: the bytes it copied (none in place).
    ``install`` puts it into the writer's module."""

    def __init__(self, in_place: bool) -> None:
        self.in_place = in_place
        self.seconds = 0.0
        self.records = 0
        self.copied = 0
        self._own: Any = None

    def __call__(self, buffer: Any) -> Any:
        import time

        import torch

        t0 = time.perf_counter()
        try:
            if not self.in_place:
                self.copied += memoryview(buffer).nbytes
                return self._own(buffer)
            if len(buffer) == 0:  # torch.frombuffer refuses an empty buffer
                return torch.empty(0, dtype=torch.uint8)
            import warnings

            with warnings.catch_warnings():
                # torch's writer hands a read-only view; the writer only reads it
                warnings.simplefilter("ignore", UserWarning)
                return torch.frombuffer(buffer, dtype=torch.uint8)
        finally:
            self.seconds += time.perf_counter() - t0
            self.records += 1

    def install(self) -> RecordCopy:
        import deepspeed.io.fast_file_writer as ffw

        self._own = ffw.bytes_to_tensor
        ffw.bytes_to_tensor = self
        return self

    def remove(self) -> None:
        import deepspeed.io.fast_file_writer as ffw

        if self._own is not None:
            ffw.bytes_to_tensor = self._own


#: DeepSpeed's own target of the decoupled engine's process, kept by install()
_ORIGINAL: list[Any] = []


def init_decoupled_checkpoint(*args: Any) -> None:
    """The decoupled engine's process target (pickled by name for the spawned child): the
    child dies with the training worker that spawned it (which leaves without the
    interpreter's teardown), the CPU writer installed in it, then DeepSpeed's own target."""
    import torch

    from iotune.workers import die_with_parent

    die_with_parent()
    if not torch.cuda.is_available():
        torch.set_num_threads(1)  # forked (install): the parent's OpenMP threads are not here
    install()
    _ORIGINAL[0](*args)


def install() -> None:
    """The decoupled engine's process started with this module's target; and without CUDA
    (where DeepSpeed pins the buffer itself), DeepSpeed's fast and decoupled writers made to
    work on this host's CPU."""
    import torch
    from deepspeed.runtime.checkpoint_engine import decoupled_checkpoint_engine as dce

    # the engine reads the module's global when it starts its process
    if not _ORIGINAL:
        _ORIGINAL.append(dce.init_decoupled_checkpoint)
    dce.init_decoupled_checkpoint = init_decoupled_checkpoint
    if torch.cuda.is_available():
        return
    import torch.multiprocessing as mp

    # DeepSpeed's engine asks for spawn only where no method was chosen (module doc); this
    # is iotune's own worker (a zygote's fork may carry its server's choice)
    mp.set_start_method("fork", force=True)
    import deepspeed.io.fast_file_writer as ffw
    from deepspeed.runtime.model_checkpointing import writer_factory

    ffw.UtilsBuilder = LazyUtils  # type: ignore[attr-defined]
    writer_factory.CheckpointWriterFactory._setup_for_aio = _setup_for_aio  # type: ignore[method-assign]


@contextlib.contextmanager
def writer_ends(engine: Any) -> Iterator[None]:
    """The decoupled writer's process told to end when the steps do, however they end: the
    training worker leaves with os._exit (DeepSpeed's destructor, which would tell it, never
    runs), and a process left waiting for its next save keeps the run from ending."""
    try:
        yield
    finally:
        ce = getattr(engine, "checkpoint_engine", None)
        if ce is not None and ce.is_decoupled():
            ce.cleanup()
