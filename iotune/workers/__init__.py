"""Code that imports torch or DeepSpeed runs here, each in its own process, so a crash, a hang
or CUDA state costs one record, not the caller."""

from __future__ import annotations

import os
import sys


def worker_env() -> dict[str, str]:
    """Environment for workers: DeepSpeed's JIT-built ops cached per virtualenv.

    torch caches extensions in ~/.cache/torch_extensions/<python>_<cuda>/ by default; two
    virtualenvs then rebuild each other's async_io op (minutes each time) because its
    build file names the other install's sources. A user's TORCH_EXTENSIONS_DIR wins.
    """
    env = {}
    if "TORCH_EXTENSIONS_DIR" not in os.environ:
        env["TORCH_EXTENSIONS_DIR"] = os.path.join(sys.prefix, "var", "torch_extensions")
    return env
