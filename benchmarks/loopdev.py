"""The loop device the tracing benchmarks run their fio jobs on."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def loop_device(
    directory: str = "/dev/shm",  # noqa: S108 - RAM, on purpose
    mib: int = 1024,
    filled: bool = True,
    direct_io: bool = False,
) -> Iterator[str]:
    """A loop device (its /dev path) over a *mib* MiB file in a new folder under *directory*,
    detached and removed afterwards. *filled*: written with zeros first, so that reads find
    data (in /dev/shm: pages of RAM) instead of a sparse file's holes. *direct_io*: the loop
    driver reads and writes its file with direct I/O."""
    work = Path(tempfile.mkdtemp(dir=directory, prefix="iotune-bench-"))
    img = work / "loop.img"
    dev = ""
    try:
        if filled:
            subprocess.run(
                ["dd", "if=/dev/zero", f"of={img}", "bs=1M", f"count={mib}", "status=none"],
                check=True,
            )
        else:
            with img.open("wb") as fh:
                fh.truncate(mib << 20)
        argv = ["losetup", "--find", "--show", *(["--direct-io=on"] if direct_io else []), str(img)]
        dev = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
        yield dev
    finally:
        if dev:
            subprocess.run(["losetup", "-d", dev], check=False)
        shutil.rmtree(work, ignore_errors=True)
