"""What a trace is asked to do: the drives, the backend, the workload and its environment,
where the results go (:class:`TraceRequest`, run by iotune.trace.runner)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iotune.trace.targets import Targets


@dataclass
class TraceRequest:
    targets: Targets
    backend: str  # "libbpf" | "bcc" | "diskstats"
    focus: int
    interval: float
    out: Path
    duration: float | None = None
    command: list[str] | None = None
    quiet_stdout: bool = False  # send the workload's stdout to stderr (--json owns stdout)
    meta: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # extra environment for the workload
    # the workload in its own process group, stopped as a group: for workers that start
    # helper processes (ZenFlow's optimizer process) which must not outlive them
    own_group: bool = False
    latency: bool = True  # time each request and count the drives' depth
    only_pid: int | None = None  # count only this process tree's requests (iotune.trace.only)
    only_cgroup: str | None = None  # or only this cgroup v2's
    #: the drives whose totals a step's row gives apart (a training's offload volume, beside
    #: the checkpoint and persist volumes also traced); empty: all the traced drives
    primary: tuple[str, ...] = ()
