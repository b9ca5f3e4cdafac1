"""The stripe's share counted chunk by chunk, the way md RAID0 places a file that starts on a
chunk: each piece of at most a chunk goes to the next member in turn, and a file is done when
the member with the most of its bytes is. The planner's closed form
(iotune.plan.drives.stripe_share) is checked against this count."""

from __future__ import annotations

from collections.abc import Iterable

from iotune.model.dsconfig import ds_config
from iotune.model.presets import Preset
from iotune.model.swapfiles import swap_files


def share_by_count(files: Iterable[int], chunk: int, k: int) -> float:
    files = list(files)
    slowest = 0
    for size in files:
        loads = [0] * k
        for i, start in enumerate(range(0, size, chunk)):
            loads[i % k] += min(chunk, size - start)
        slowest += max(loads) if files else 0
    return sum(files) / (k * slowest) if slowest else 1.0


def preset_shares(
    preset: Preset, k: int, chunk: int = 512 << 10, *, parameters: bool = True
) -> tuple[float, float]:
    """(read, write) shares of K drives' rate for the swap files of *preset* at its aio block."""
    reads, writes = swap_files(preset, ds_config(preset), parameters=parameters)
    return share_by_count(reads, chunk, k), share_by_count(writes, chunk, k)
