"""A trace's Ctrl-C and SIGTERM are taken between its samples, never inside one (the tracer's
loop, iotune/trace/runner.py): with real signals to this process, a real workload writing
its events, and the diskstats backend on a drive of a made sysfs tree."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from iotune.probes.sysfs import SysTree
from iotune.trace.request import TraceRequest
from iotune.trace.runner import Tracer
from iotune.trace.targets import Targets

#: writes two step events where the trace reads them, in one write(2): a reader sees both or
#: neither, never the first alone (two writes let a busy host run the trace between them, and
#: the second step was then read after the signal had stopped the trace), then waits to be
#: stopped
WORKLOAD = """
import json, os, time
lines = "".join(json.dumps({"event": "step", "step": step}) + "\\n" for step in (1, 2))
fd = os.open(os.environ["IOTUNE_EVENTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
if os.write(fd, lines.encode()) != len(lines):
    raise SystemExit("a short write")
os.close(fd)
time.sleep(60)
"""


def _tree(root: Path) -> SysTree:
    block = root / "sys" / "block" / "fake0"
    block.mkdir(parents=True)
    (block / "dev").write_text("259:0\n")
    (block / "stat").write_text(" ".join(["0"] * 17) + "\n")
    (block / "inflight").write_text("0 0\n")
    return SysTree(root)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_steps_sample_keeps_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    """The signal comes while the first step's sample is being taken, the second step's
    event already read with it: both steps are sampled, then the trace stops, interrupted
    as that signal says, the workload stopped with it. Raised where it came, the exception
    took both events with it, and the interrupted trace had no row for either step."""
    req = TraceRequest(
        targets=Targets(("fake0",)),
        backend="diskstats",
        focus=512 << 10,
        interval=30.0,
        out=tmp_path / "out",
        command=[sys.executable, "-c", WORKLOAD],
    )
    tracer = Tracer(req, tree=_tree(tmp_path))
    taken = Tracer.sample

    def sample(self: Tracer, label: str) -> object:
        if label == "step:1":
            os.kill(os.getpid(), sig)  # handled at the next bytecode: inside this sample
        return taken(self, label)

    monkeypatch.setattr(Tracer, "sample", sample)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    tracer.run()
    labels = [s.label for s in tracer.samples]
    assert labels[0] == "start" and labels[-1] == "end", labels
    assert "step:1" in labels and "step:2" in labels, labels
    assert tracer.interrupted == sig.name, tracer.interrupted
    assert tracer.exit_code is not None  # the workload was stopped, not left running
    # the handlers found are back
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
