"""NVMe over TCP under training, in the study's lab (tests/vm/study_lab.py), once its study
is done, beside its checkpoints and its member lost (through the lab's second agent: none of
them is timed, and they wait on throttled drives while this uses the CPU): two of its drives
(FB0, FB1: not throttled, so nothing but the emulated CPU paces the transport) exported by
the guest's own target (nvmet-tcp on 127.0.0.1, as tests/vm/test_fabrics_vm.py sets it up),
connected with `iotune fabrics connect`, a RAID0 over the two namespaces built with `iotune
raid create` (xfs, mounted), and on it, through the lab's zygote: `iotune sweep-aio` with
DeepSpeed's swapping pattern of the study's model, and `iotune trace --run tiny_opt_nvme`
(each request counted on its namespace). A path lost under a workload is the session
guest's (tests/vm/test_fabrics_vm.py): here, beside the checkpoint runs, the `sync` each
run's start makes would wait on the lost namespaces' file system (seen: the lab's runs held
until ctrl_loss_tmo). The lab's guest boots with ``nvme_core.multipath=N``: a namespace
is a disk of its own."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.vm.study_lab import FAB_SERIALS, SET_ARGS, Lab, sweep_args

NQN = "nqn.2026-11.io.iotune:lab"
PORT = "1"
ADDR = "127.0.0.1"
TARGET = str(Path(__file__).resolve().parent / "nvmet_target.py")
#: the traced run's steps: the first, then a steady one
FAB_STEPS = 2


@dataclass(frozen=True)
class FabricRuns:
    #: the two namespaces (block device names), as `fabrics connect` named them
    namespaces: list[str]
    #: `raid create --json` over them
    created: dict[str, Any]
    #: `sweep-aio --json` on the RAID0's file system
    sweep: dict[str, Any]
    #: `trace --run --json`: the run on the RAID0, and its records' folder
    run: dict[str, Any]
    run_out: Path


def run_fabric(lab: Lab, go_on: Callable[[], None] = lambda: None) -> FabricRuns:
    """The target up and connected, the RAID0 built, the sweep, the run."""
    py = sys.executable
    backing = [f"/dev/{lab.names[s]}" for s in FAB_SERIALS]
    lab.guest.run([py, TARGET, "up", NQN, ADDR, PORT, *backing]).check()
    done = lab.iotune_json("fabrics", "connect", f"tcp://{ADDR}")
    if not done.get("connected") or len(done.get("namespaces") or []) != 2:
        raise RuntimeError(f"fabrics connect: {done}")
    names = sorted(done["namespaces"])
    devs = [f"/dev/{n}" for n in names]
    created = lab.iotune_json(
        "raid", "create", *devs, "--name", "fab", "--mount", "/tmp/fab", "--yes"
    )
    go_on()
    sweep = lab.iotune_json(*sweep_args("/tmp/fab", lab.share / "sweep-fab"), timeout=1200)
    go_on()
    run_out = lab.share / "fab-run"
    run = lab.iotune_json(
        *("trace", "--run", "tiny_opt_nvme", *SET_ARGS, "--nvme-path", "/tmp/fab"),
        *("--steps", str(FAB_STEPS), "--out", str(run_out)),
        timeout=1500,
    )
    return FabricRuns(names, created, sweep, run, run_out)
