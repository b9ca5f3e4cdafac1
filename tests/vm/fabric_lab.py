"""NVMe over TCP across a network under training, in the study's lab (tests/vm/study_lab.py),
once its study is done, beside its checkpoints and its member lost (through the lab's second
agent: none of them is timed, and they wait on throttled drives while this uses the CPU).
Two hosts on one wire (tests/vm/guest.Link): the session's other guest (tests/vm/conftest.py)
is the target, its kernel's nvmet-tcp exporting two of its drives (FB0, FB1: not
throttled, so nothing but the emulated CPUs and the link pace the transport) on its address;
the lab connects them with `iotune fabrics connect`, builds a RAID0 over the two namespaces
with `iotune raid create` (xfs, mounted), and on it, through the lab's zygote, runs `iotune
sweep-aio` with DeepSpeed's swapping pattern of the study's model, `iotune trace --run
tiny_opt_nvme` (each request counted on its namespace), and a second run whose network is
cut once the run has initialised: the lab's end of the link taken down (LOSE_PATH, in the
lab). That one runs while the checkpoint runs go on beside it: their start writes back
their own drives' file systems (syncfs), not every one (sync(2) would wait on the lost
namespaces' until ctrl_loss_tmo). Both guests boot with ``nvme_core.multipath=N``: a
namespace is a disk of its own."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.vm.guest import Guest, Link
from tests.vm.study_lab import BIN, SET_ARGS, Lab, sweep_args

NQN = "nqn.2026-11.io.iotune:lab"
#: the target's nvmet port (the session guest's own fabrics tests use port 1 on 127.0.0.1)
PORT = "7"
#: the target: the session guest, host 1 on the link
ADDR = Link.addr(1)
#: the target's drives (the session guest's), exported to the lab
FAB_SERIALS = ("FB0", "FB1")
TARGET = str(Path(__file__).resolve().parent / "nvmet_target.py")
#: the traced run's steps: the first, then a steady one
FAB_STEPS = 2

#: in the lab: a traced run on the fabric RAID0 (argv as JSON), the lab's end of the link
#: (its interface, argv 3) taken down once the run's init record is written (the steps after
#: it swap to the namespaces); its exit code, stderr and the seconds from the loss to its
#: end. Then, the path still lost: whether a sync(2) started then is still held after 3 s (it
#: waits on the lost namespaces' xfs, and ends once they are back), and the seconds a run's
#: write-back of another file system (the guest's /tmp) took meanwhile
LOSE_PATH = """
import json, os, subprocess, sys, time
from iotune.probes.sysfs import SysTree
from iotune.trace.writeback import write_back
argv, steps, iface = json.loads(sys.argv[1]), *sys.argv[2:4]
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
subprocess.run(["ip", "link", "set", iface, "down"], check=True)
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
    #: `devices --all --json` of the namespaces once connected
    devices: dict[str, Any]
    #: the lab's end of the link (its interface)
    iface: str
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
    #: the phases' wall seconds (the target up, connect, raid create, sweep, run, lost path)
    seconds: dict[str, float]


def run_fabric(
    lab: Lab, target: Guest, backing: list[str], go_on: Callable[[], None] = lambda: None
) -> FabricRuns:
    """The target up in the other guest (*backing*: its drives) and connected across the
    link, the RAID0 built, the sweep, the run, the lost path."""
    py = sys.executable
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    target.run([py, TARGET, "up", NQN, ADDR, PORT, *backing]).check()
    route = lab.guest.run(["ip", "-o", "route", "get", ADDR]).check().stdout.split()
    iface = route[route.index("dev") + 1]
    _wait_reachable(lab)
    seconds["target up"], t0 = time.monotonic() - t0, time.monotonic()
    done = lab.iotune_json("fabrics", "connect", f"tcp://{ADDR}")
    if not done.get("connected") or len(done.get("namespaces") or []) != 2:
        raise RuntimeError(f"fabrics connect: {done}")
    names = sorted(done["namespaces"])
    devs = [f"/dev/{n}" for n in names]
    devices = lab.iotune_json("devices", "--all", *devs)
    seconds["connect"], t0 = time.monotonic() - t0, time.monotonic()
    created = lab.iotune_json(
        "raid", "create", *devs, "--name", "fab", "--mount", "/tmp/fab", "--yes"
    )
    seconds["raid create"] = time.monotonic() - t0
    go_on()
    t0 = time.monotonic()
    sweep = lab.iotune_json(*sweep_args("/tmp/fab", lab.share / "sweep-fab"), timeout=1200)
    seconds["sweep"] = time.monotonic() - t0
    go_on()
    t0 = time.monotonic()
    run_out = lab.share / "fab-run"
    run = lab.iotune_json(
        *("trace", "--run", "tiny_opt_nvme", *SET_ARGS, "--nvme-path", "/tmp/fab"),
        *("--steps", str(FAB_STEPS), "--out", str(run_out)),
        timeout=1500,
    )
    seconds["run"] = time.monotonic() - t0
    go_on()
    t0 = time.monotonic()
    out = lab.share / "fab-lost"
    argv = [
        str(BIN / "iotune"),
        *("trace", "--run", "tiny_opt_nvme", *SET_ARGS, "--nvme-path", "/tmp/fab"),
        *("--steps", "50", "--out", str(out)),
    ]
    try:
        r = lab.guest.run(
            [py, "-c", LOSE_PATH, json.dumps(argv), str(out / "steps.jsonl"), iface],
            timeout=1500,
            env=lab.env,
        ).check()
        lost = json.loads(r.stdout)
        lost_devices = lab.iotune_json("devices", "--all", *devs)
        lost_status = lab.iotune_json("raid", "status", "fab")
        no = lab.iotune("raid", "create", *devs, "--name", "gone", "--yes")
        refused = {"rc": no.rc, "stderr": no.stderr}
        # a run and a sweep on the array: refused before their first write there. Beside
        # each, the same command on a directory that does not exist, refused by the check
        # just before: the guest's own time to start the command and refuse, under the
        # host's load at that moment
        for name, at in (
            (
                "run",
                lambda d: (
                    *("trace", "--run", "tiny_opt_nvme", *SET_ARGS, "--nvme-path", d),
                    *("--steps", "2", "--out", str(lab.share / "fab-not-started")),
                ),
            ),
            ("sweep", lambda d: tuple(sweep_args(d, lab.share / "sweep-fab-lost"))),
        ):
            # their own clocks: t0 is the lost path's, read after the loop
            ta = time.monotonic()
            base = lab.iotune(*at("/tmp/fab-none"), timeout=120)
            tb = time.monotonic()
            no = lab.iotune(*at("/tmp/fab"), timeout=120)
            refused[name] = {
                "rc": no.rc,
                "stderr": no.stderr,
                "s": time.monotonic() - tb,
                "base": {"rc": base.rc, "stderr": base.stderr, "s": tb - ta},
            }
    finally:
        lab.guest.run(["ip", "link", "set", iface, "up"]).check()
    _wait_live(lab, devs)
    seconds["lost path"] = time.monotonic() - t0
    return FabricRuns(
        names,
        devices,
        iface,
        created,
        sweep,
        run,
        run_out,
        lost,
        out,
        lost_devices,
        lost_status,
        refused,
        seconds,
    )


def _wait_reachable(lab: Lab, seconds: float = 120.0) -> None:
    """The target's port answers across the link (a TCP connection to it)."""
    probe = f"import socket; socket.create_connection(({ADDR!r}, 4420), timeout=5).close()"
    deadline = time.monotonic() + seconds
    while (r := lab.guest.run([sys.executable, "-c", probe])).rc != 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ADDR}:4420 does not answer across the link: {r.stderr[-500:]}")
        time.sleep(1)


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


def fabric_summary(runs: FabricRuns) -> list[str]:
    """What the fabric's runs showed, for the test session's summary (the guests' folders go
    when every test passed)."""
    mib = 2**20
    lines = []
    for d in runs.devices["devices"]:
        f = d["fabric"]
        link = f"{f['link_mbps'] / 1000:g} Gb/s" if f["link_mbps"] else "no speed"
        lines.append(
            f"{d['name']}: {f['transport']} {f['target']} {f['nqn']} {f['state']}, "
            f"link {f['iface']} {link}"
        )
    ceil = {c["op"]: c["bw_bytes_s"] for c in runs.sweep["ceilings"] if c.get("bw_bytes_s")}
    swap = runs.sweep["swap"]
    lines.append(
        "sweep-aio on the RAID0: fio's ceiling "
        + ", ".join(f"{op} {bw / mib:.0f} MiB/s" for op, bw in sorted(ceil.items()))
        + f"; the swap rehearsal read {swap['read_bytes'] / mib:.1f} MiB at "
        f"{swap['read_bw_bytes_s'] / mib:.0f} MiB/s, wrote {swap['write_bytes'] / mib:.1f} MiB"
    )
    lines.append(
        "the phases' seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in runs.seconds.items())
    )
    steady = runs.run["io_steps"][-1]
    lines.append(
        f"trace --run, {steady['label']}: "
        + ", ".join(
            f"{m} read {v['read']:,} B, wrote {v['write']:,} B"
            for m, v in sorted(steady["drives"].items())
            if m in runs.namespaces
        )
        + f"; the model's read {runs.run['estimate']['steady_step']['read']:,} B"
    )
    lost = runs.lost
    lines.append(
        f"link down under training: exit {lost['rc']} after {lost['after_s']:.1f} s; a sync "
        f"then {'held' if lost['sync_held'] else 'not held'}, the run's write-back "
        f"{lost['write_back_s']:.2f} s"
    )
    lines += [x for x in lost["stderr"].splitlines() if x.startswith(("iotune: error", "hint:"))]
    return lines
