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
            if builder is None or not (build or built(builder)["built"]):
                continue
            t0 = time.monotonic()
            builder.load(verbose=False)
        except Exception:  # noqa: BLE001, S112 - the run's own check loads it and reports
            continue
        took[builder.name] = round(time.monotonic() - t0, 3)
    return took
