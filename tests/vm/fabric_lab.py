"""NVMe over TCP under training, in the study's lab (tests/vm/study_lab.py), once its study
is done, beside its checkpoints and its member lost (through the lab's second agent: none of
them is timed, and they wait on throttled drives while this uses the CPU): two of its drives
(FB0, FB1: not throttled, so nothing but the emulated CPU paces the transport) exported by
the guest's own target (nvmet-tcp on 127.0.0.1, as tests/vm/test_fabrics_vm.py sets it up),
connected with `iotune fabrics connect`, a RAID0 over the two namespaces built with `iotune
raid create` (xfs, mounted), and on it, through the lab's zygote: `iotune sweep-aio` with
DeepSpeed's swapping pattern of the study's model, `iotune trace --run tiny_opt_nvme` (each
request counted on its namespace), and a second run whose target is taken off its port once
the run has initialised (LOSE_PATH, in the guest). That one runs while the checkpoint runs
go on beside it: their start writes back their own drives' file systems (syncfs), not
every one (sync(2) would wait on the lost namespaces' until ctrl_loss_tmo). The lab's guest
boots with ``nvme_core.multipath=N``: a namespace is a disk of its own."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.vm.study_lab import BIN, FAB_SERIALS, SET_ARGS, Lab, sweep_args

NQN = "nqn.2026-11.io.iotune:lab"
PORT = "1"
ADDR = "127.0.0.1"
TARGET = str(Path(__file__).resolve().parent / "nvmet_target.py")
#: the traced run's steps: the first, then a steady one
FAB_STEPS = 2

#: in the guest: a traced run on the fabric RAID0 (argv as JSON), its target's subsystem
#: taken off the port once the run's init record is written (the steps after it swap to the
#: namespaces); its exit code, stderr and the seconds from the loss to its end. Then, the
#: path still lost: whether a sync(2) started then is still held after 3 s (it waits on the
#: lost namespaces' xfs, and ends once they are back), and the seconds a run's write-back
#: of another file system (the guest's /tmp) took meanwhile
LOSE_PATH = """
import json, os, subprocess, sys, time
from iotune.probes.sysfs import SysTree
from iotune.trace.writeback import write_back
argv, steps, target, nqn, port = json.loads(sys.argv[1]), *sys.argv[2:6]
log = open("/tmp/fab-lost.err", "w+")
p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, text=True)
deadline = time.monotonic() + 900
while not (os.path.exists(steps) and '"init"' in open(steps).read()):
    if p.poll() is not None or time.monotonic() > deadline:
        p.kill()
        log.seek(0)
        sys.exit(f"no init record (exit {p.poll()}): {log.read()[-3000:]}")
    time.sleep(0.05)
t0 = time.monotonic()
subprocess.run([sys.executable, target, "detach", nqn, port], check=True)
p.wait(timeout=240)
after = time.monotonic() - t0
# nothing of the agent's inherited: its output would stay open while sync waits
held = subprocess.Popen(["sync"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, start_new_session=True)
time.sleep(3)
t1 = time.monotonic()
write_back(SysTree("/"), [], ["/tmp"])
log.seek(0)
print(json.dumps({"rc": p.returncode, "stderr": log.read()[-6000:], "after_s": after,
                  "sync_held": held.poll() is None, "write_back_s": time.monotonic() - t1}))
"""


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
    #: the run whose target went away: rc, stderr, after_s (what LOSE_PATH printed)
    lost: dict[str, Any]
    #: its records' folder
    lost_out: Path
    #: `devices --all --json` of the namespaces while their path was lost
    lost_devices: dict[str, Any]
    #: `raid status --json fab` then (no read of the array: it would wait)
    lost_status: dict[str, Any]
    #: `raid create` over them then: rc and stderr; and under "run" and "sweep", a training
    #: run's and a sweep's on the array then (with their seconds, "s")
    refused: dict[str, Any]


def run_fabric(lab: Lab, go_on: Callable[[], None] = lambda: None) -> FabricRuns:
    """The target up and connected, the RAID0 built, the sweep, the run, the lost path."""
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
    go_on()
    out = lab.share / "fab-lost"
    argv = [
        str(BIN / "iotune"),
        *("trace", "--run", "tiny_opt_nvme", *SET_ARGS, "--nvme-path", "/tmp/fab"),
        *("--steps", "50", "--out", str(out)),
    ]
    try:
        r = lab.guest.run(
            [py, "-c", LOSE_PATH, json.dumps(argv), str(out / "steps.jsonl"), TARGET, NQN, PORT],
            timeout=1500,
            env=lab.env,
        ).check()
        lost = json.loads(r.stdout)
        lost_devices = lab.iotune_json("devices", "--all", *devs)
        lost_status = lab.iotune_json("raid", "status", "fab")
        no = lab.iotune("raid", "create", *devs, "--name", "gone", "--yes")
        refused = {"rc": no.rc, "stderr": no.stderr}
        # a run and a sweep on the array: refused before their first write there
        for name, args in (
            (
                "run",
                (
                    *("trace", "--run", "tiny_opt_nvme", *SET_ARGS, "--nvme-path", "/tmp/fab"),
                    *("--steps", "2", "--out", str(lab.share / "fab-not-started")),
                ),
            ),
            ("sweep", tuple(sweep_args("/tmp/fab", lab.share / "sweep-fab-lost"))),
        ):
            t0 = time.monotonic()
            no = lab.iotune(*args, timeout=120)
            refused[name] = {"rc": no.rc, "stderr": no.stderr, "s": time.monotonic() - t0}
    finally:
        lab.guest.run([py, TARGET, "attach", NQN, PORT]).check()
    _wait_live(lab, devs)
    return FabricRuns(
        names, created, sweep, run, run_out, lost, out, lost_devices, lost_status, refused
    )


def _wait_live(lab: Lab, devs: list[str], seconds: float = 180.0) -> None:
    """Both namespaces live again (the host's controller reconnected to the target)."""
    deadline = time.monotonic() + seconds
    while True:
        doc = lab.iotune_json("devices", "--all", *devs)
        states = [(d.get("fabric") or {}).get("state") for d in doc["devices"]]
        if states and all(s == "live" for s in states):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the namespaces did not reconnect: {states}")
        time.sleep(3)
