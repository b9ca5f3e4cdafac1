"""Worker: one point of ``sweep-checkpoint --copy-from``: a swap folder made, or copied once.

    python -m iotune.workers.copy_point REQUEST.json

The request's ``op``:

- ``make``: files of ``sizes`` bytes in ``folder``, written O_DIRECT and fsynced, as
  DeepSpeed's swapper leaves its swap files (iotune.workers.copyrate.make_folder);
- ``ceiling``: the raw O_DIRECT copy of ``src`` into ``dst`` at each of the ceiling's
  settings, the page cache dropped before each (iotune.workers.copyrate.ceiling);
- ``copy``: ``src`` copied into ``dst`` by ``copy`` (aio with ``settings``, reflink, or
  deepspeed's copytree), durable when it returns (iotune.workers.swapcopy.copy_tree), the
  page cache dropped before and the aio op loaded before (as a run's worker has it);
  every file checked against its source (its size, its first and last MiB) and the copy
  removed.

Prints one JSON object on the original stdout.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from iotune.workers import report_json_request

MIB = 1 << 20


def same_ends(a: Path, b: Path) -> bool:
    """Each file of *a* in *b*, of the same size, its first and last MiB the same."""
    for f in a.iterdir():
        g = b / f.name
        size = f.stat().st_size
        if not g.is_file() or g.stat().st_size != size:
            return False
        with open(f, "rb") as x, open(g, "rb") as y:
            for off in (0, max(0, size - MIB)):
                x.seek(off)
                y.seek(off)
                if x.read(MIB) != y.read(MIB):
                    return False
    return True


def work(req: dict[str, Any]) -> dict[str, Any]:
    from deepspeed.ops.op_builder import AsyncIOBuilder

    from iotune.workers.copyrate import ceiling, drop_caches, make_folder
    from iotune.workers.swapcopy import AioSettings, copy_tree

    # the op loaded first, whatever the copy: as a run's worker has it (its swapper's), and
    # every copy the same from the page cache's drop on (on this project's virtual disk the
    # raw copy ran at 1.2-1.3 GiB/s where the op was loaded between the drop and the copy,
    # at 0.7-0.9 where it was loaded before: benchmarks/RESULTS.md)
    AsyncIOBuilder().load(verbose=False)
    op = req["op"]
    if op == "make":
        n = make_folder(Path(req["folder"]), [int(s) for s in req["sizes"]])
        return {"bytes": n, "files": len(req["sizes"])}
    src, dst = Path(req["src"]), Path(req["dst"])
    if op == "ceiling":
        return ceiling(src, dst)
    drop_caches()
    settings = AioSettings(**req["settings"]) if req.get("settings") else None
    try:
        r = copy_tree(src, dst, req["copy"], settings=settings)
        same = same_ends(src, dst)
    finally:
        shutil.rmtree(dst, ignore_errors=True)
    return {
        "seconds": r.seconds,
        "blocked_s": r.seconds - r.durable_s,
        "durable_s": r.seconds,
        "bytes": r.bytes,
        "files": r.files,
        "same": same,
    }


if __name__ == "__main__":
    report_json_request(work)
