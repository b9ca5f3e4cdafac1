"""The NVMe over Fabrics namespaces among the traced drives, watched while a workload runs.

A target that goes away does not fail the host's I/O: the controller turns ``connecting``
and queues every request until it reconnects, or until ``ctrl_loss_tmo`` (600 s by default)
has passed. A training run on such a volume would stand still for ten minutes and then fail
with an I/O error that names no drive. The tracer asks this watch at each of its ticks; a
namespace without a live path for ``GRACE_S`` (a reconnect within it is tolerated), or gone,
stops the workload, and the trace says which namespace and why."""

from __future__ import annotations

from iotune.probes.fabrics import read_fabric
from iotune.probes.sysfs import SysTree

#: seconds a namespace may be without a live path before the workload is stopped
GRACE_S = 10.0


class PathWatch:
    def __init__(self, tree: SysTree, disks: tuple[str, ...], grace_s: float = GRACE_S) -> None:
        self.tree = tree
        self.grace_s = grace_s
        self.fabrics = {d: f for d in disks if (f := read_fabric(tree, d)) is not None}
        self._since: dict[str, float] = {}

    def _state(self, d: str) -> str | None:
        """Namespace *d*'s controller state now ("live", "connecting", ...); "gone" if its
        disk is there but no fabric's; None if its disk is gone."""
        if not self.tree.exists(f"/sys/block/{d}"):
            return None
        f = read_fabric(self.tree, d)
        return "gone" if f is None else f.state

    def not_live(self) -> str | None:
        """Before the workload starts: the first namespace without a live path, in words."""
        for d, first in self.fabrics.items():
            if (state := self._state(d) or "gone") != "live":
                return f"{d} has no live path to {first.describe()} ({state})"
        return None

    def check(self, now: float) -> str | None:
        """None while every namespace has a live path (or has had one within the grace);
        else one line naming the first that has not."""
        for d, first in self.fabrics.items():
            state = self._state(d)
            if state == "live":
                self._since.pop(d, None)
                continue
            t0 = self._since.setdefault(d, now)
            if state is None or now - t0 >= self.grace_s:
                return f"{d} lost its path to {first.describe()}: {state or 'gone'}" + (
                    "" if state is None else f" for {now - t0:.0f} s"
                )
        return None
