"""The RAID0 study's lab: a guest of its own (QEMU TCG) with seven NVMe drives throttled
to the same bandwidth, a single drive, a RAID0 of 2 and a RAID0 of 4 built with `iotune raid
create` (and four more drives, a RAID6 for checkpoints: tests/vm/checkpoint_lab.py; and a
NIC on the session's virtual network, whose other guest exports two drives over NVMe/TCP:
tests/vm/fabric_lab.py), and a zygote that has imported torch, DeepSpeed and transformers
once, for every training and AIO worker to fork from; and the study's sweeps and runs on it
(``sweeps_and_study``, then ``plans_of``).
Used by tests/vm/test_study_vm.py through the ``lab`` and ``lab_runs`` fixtures
(tests/vm/conftest.py), which bring the lab up early and run the study beside the tests
marked ``beside_study``."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event
from typing import Any

from iotune.records import read_records
from tests.vm import guest_ops
from tests.vm.guest import Drive, Guest, Link, Result

MIB = 2**20
#: each drive's bandwidth, reads and writes each (the guest's block layer: Guest.throttle)
BPS = 2 * MIB
VOLUMES = {"single": ("ST0",), "raid0x2": ("ST1", "ST2"), "raid0x4": ("ST3", "ST4", "ST5", "ST6")}
#: the checkpoints' RAID6 (tests/vm/checkpoint_lab.py): not throttled, the RAID0's reads pace
#: each save
CK_SERIALS = ("CK0", "CK1", "CK2", "CK3")
#: the volume the checkpointed runs offload to once the study is done: the RAID0 of four, as
#: the member lost (lose_a_member) breaks the RAID0 of two beside them
CK_OFFLOAD = "raid0x4"
CK_OFFLOAD_MOUNT = f"/tmp/{CK_OFFLOAD}"
#: each RAID6 member's size. The array's initial resync reads every member and computes both
#: parities on the guest's emulated CPU, beside the zygote's imports; but at 256 MiB (512 MiB
#: of data) mkfs.xfs refuses the array: with the stripe's alignment its log would be under
#: the 64 MB it needs (benchmarks/RESULTS.md)
CK_MIB = 1024
#: power lost during a save (tests/vm/powerloss_lab.py): the volume under device-mapper's
#: log-writes target, its log, and a drive a replayed point goes back on (XFS wants 300 MB)
LW_SERIALS = ("LW0", "LW1", "LW2")
LW_MIB = 320
DRIVES = [
    *(Drive(s, size_mib=2048, bps=BPS) for members in VOLUMES.values() for s in members),
    *(Drive(s, size_mib=CK_MIB) for s in CK_SERIALS),
    *(Drive(s, size_mib=512 if s == "LW1" else LW_MIB) for s in LW_SERIALS),
]
ZYGOTE = "/tmp/iotune-zygote.sock"
#: the lab's agents beside its first (Lab.beside)
AGENTS = ("side", "plans")
BIN = Path(sys.executable).parent
#: the CPU priority of the lab once its study runs: above the tests that run beside it, so
#: that its steps' emulated CPU (a few per cent of a step that waits on the drives) is not
#: slowed by them and the study measures what it measures on its own
STUDY_NICE = -10

STRATEGIES = ("opt_nvme", "params_opt_nvme")
SETS = (
    "seq_len=2",
    "model.num_hidden_layers=1",
    "model.hidden_size=256",
    "model.intermediate_size=768",
    "model.vocab_size=4096",
)
#: a warm-up step and three steady ones, whose median is the run's step. With two, their mean
#: was: the second step often carries the first's writes still draining on a 2 MiB/s drive
#: (forward + backward 8.36 s, then 4.47 s, for the same fetches), and on an AVX2 host the
#: guest's compute under the host's load moved the 4-drive step of the same strategy from
#: 9.31 to 12.31 s over five runs (benchmarks/RESULTS.md): one slow step is outvoted now
STEPS = 4
#: SETS as iotune's options
SET_ARGS = tuple(a for s in SETS for a in ("--set", s))

#: in the guest: waits for a run's init record, stops the run (SIGSTOP), unplugs a drive's
#: NVMe controller, and lets the run go on (SIGCONT); argv: the run's steps.jsonl, the drive
UNPLUG = """
import json, os, signal, sys, time
steps, drive = sys.argv[1], sys.argv[2]
runs = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(steps))), "runs.jsonl")
deadline = time.monotonic() + 850
text = ""
while '"init"' not in text:
    if time.monotonic() > deadline:
        sys.exit(f"no init record in {steps}")
    if os.path.exists(runs) and open(runs).read().strip():
        sys.exit(f"the run ended before its init record: {open(runs).read()[-2000:]}")
    time.sleep(0.02)
    text = open(steps).read() if os.path.exists(steps) else ""
pid = next(json.loads(line)["pid"] for line in text.splitlines() if '"ready"' in line)
os.kill(pid, signal.SIGSTOP)
try:
    with open(f"/sys/block/{drive}/device/device/remove", "w") as f:
        f.write("1")
finally:
    os.kill(pid, signal.SIGCONT)
"""

#: runs commands side by side in the guest; their exit codes and output as JSON
TOGETHER = """
import json, subprocess, sys
ps = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for a in json.loads(sys.argv[1])]
print(json.dumps([dict(zip(("stdout", "stderr"), p.communicate()), rc=p.returncode) for p in ps]))
"""


@dataclass
class Lab:
    guest: Guest
    env: dict[str, str]
    names: dict[str, str] = field(default_factory=dict)

    @property
    def share(self) -> Path:
        return self.guest.share

    #: the guest's other agents (Guest.agent) by name, started with the lab
    agents: dict[str, Guest] = field(default_factory=dict)

    def beside(self, agent: str = "side") -> Lab:
        """The same lab through its agent *agent*: commands sent through it run beside
        those sent through this one, and through the others."""
        if agent not in self.agents:
            raise RuntimeError(f"the lab has no agent {agent!r}")
        return Lab(self.agents[agent], self.env, self.names)

    def iotune(self, *args: str, timeout: float = 600.0) -> Result:
        return self.guest.run([str(BIN / "iotune"), *args], timeout=timeout, env=self.env)

    def iotune_json(self, *args: str, timeout: float = 600.0) -> Any:
        return json.loads(self.iotune("--json", *args, timeout=timeout).check().stdout)


def wait_for(log: Path, text: str, seconds: float, cancel: Event | None = None) -> None:
    deadline = time.monotonic() + seconds
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        if cancel is not None and cancel.is_set():
            raise RuntimeError(f"stopped while waiting for {text!r} in {log}")
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise TimeoutError(f"{text!r} not in {log} after {seconds:.0f} s:\n{tail}")
        time.sleep(1)


def bring_up(
    guests: list[Guest], cancel: Event, environ: dict[str, str], link: Link | None = None
) -> Lab:
    """The guest booted, the zygote's import done, the three volumes built: minutes of
    emulated CPU that measure nothing. The guest goes into *guests* as soon as it exists,
    for whoever stops it; *cancel* set ends the bring-up at its next stage; the ops' build
    and the guest start in *environ*. On *link*, it is host 2 (tests/vm/fabric_lab.py)."""

    def go_on() -> None:
        if cancel.is_set():
            raise RuntimeError("the study's lab was stopped while it came up")

    top = guest_ops.default_dir()
    env = {**guest_ops.build(top, environ), **guest_ops.TORCH_ENV, "IOTUNE_ZYGOTE": ZYGOTE}
    go_on()
    workdir = Path(tempfile.mkdtemp(prefix="iotune-study-vm-"))
    guest = Guest(
        workdir,
        DRIVES,
        memory="4G",
        qemu_opts=(
            *("-accel", "tcg,thread=multi,tb-size=1024"),
            *(link.qemu_opts(2) if link else ()),
        ),
        rwdirs=(top,),
        environ=environ,
        # NVMe-oF namespaces as disks of their own (tests/vm/fabric_lab.py, and see
        # tests/vm/conftest.py); the emulated PCIe drives have one path each either way
        append=("nvme_core.multipath=N",),
    )
    guests.append(guest)
    guest.start(timeout=600)
    go_on()
    if link:
        link.up(guest, 2)
    # the other agents now, while the first is free to start them: the fabric's and the
    # member lost's (tests/vm/conftest.py), and the planner's (plans_of)
    lab = Lab(guest, env, agents={a: guest.agent(a) for a in AGENTS})
    # the zygote imports torch, DeepSpeed and transformers once (minutes of emulated
    # CPU); every training and AIO worker forks from it. The volumes are built meanwhile.
    log = guest.share / "zygote.log"
    guest.spawn([sys.executable, "-m", "iotune.workers.zygote", "serve", ZYGOTE], log, env)
    guest.run(["modprobe", "-a", "nvme", "md_mod", "raid0", "raid456"]).check()
    lab.names = guest.by_serial()
    # every process of the guest, the agents' and the zygote's with what they start, now
    # meets the drives' bandwidth (BPS)
    guest.throttle(lab.names)
    for name, members in VOLUMES.items():
        go_on()
        devs = [f"/dev/{lab.names[s]}" for s in members]
        if len(devs) == 1:
            guest.run(["mkfs.xfs", "-q", "-f", "-L", name, *devs]).check()
            guest.run(["mkdir", "-p", f"/tmp/{name}"]).check()
            guest.run(["mount", "-o", "noatime", *devs, f"/tmp/{name}"]).check()
            continue
        doc = lab.iotune_json(
            "raid", "create", *devs, "--name", name, "--mount", f"/tmp/{name}", "--yes"
        )
        assert doc["applied"] is True and doc["array"]["level"] == "raid0", doc
    go_on()
    ck = [f"/dev/{lab.names[s]}" for s in CK_SERIALS]
    doc = lab.iotune_json(
        "raid", "create", *ck, "--level", "6", "--name", "ckpt", "--mount", "/tmp/ckpt", "--yes"
    )
    assert doc["applied"] is True and doc["array"]["level"] == "raid6", doc
    wait_for(log, "imported in", 1200, cancel)
    return lab


@dataclass(frozen=True)
class LabRuns:
    #: each volume's ``sweep-aio --json`` document, by volume name
    sweeps: dict[str, dict[str, Any]]
    #: the study: its ``--json`` document, its folder and its run records
    study: dict[str, Any]
    #: the planner's answer per strategy for 1, 2 and 4 drives, by drive count
    plans: dict[str, dict[int, dict[str, Any]]]
    #: the same from the drives' datasheet (their throttle) and the single drive's NVMe run
    #: alone, no sweep and no RAM run: the whole ``--drives`` document per strategy
    datasheet: dict[str, dict[str, Any]]
    #: the same from that run alone (no datasheet): endurance from the drive's health log
    run_only: dict[str, dict[str, Any]]
    #: the datasheet's plan of tiny_opt_nvme as the command prints it (the session summary
    #: shows it, with the command)
    datasheet_text: str = ""


def runs_by_volume(study: dict[str, Any], strategy: str) -> dict[str, dict[str, Any]]:
    """The study's runs of *strategy* by volume name."""
    return {
        r["volume"]["name"]: r
        for r in study["runs"]
        if r.get("strategy") == strategy and r.get("volume")
    }


def ram_run(study: dict[str, Any]) -> dict[str, Any]:
    """The study's one RAM-offload run: the baseline of the predictions."""
    (ram,) = [r for r in study["runs"] if r.get("strategy") == "opt_ram"]
    return dict(ram)


def summary(runs: LabRuns) -> list[str]:
    """The study's steps, measured and predicted (the study's and the planner's), a line per
    strategy and volume: for the test session's summary, whose guest folders go when every
    test passed."""
    lines = []
    for s in STRATEGIES:
        for name, r in runs_by_volume(runs.study, s).items():
            m = r["measured"]["step_s"]
            pred = (r.get("prediction") or {}).get("step_s")
            k = len(VOLUMES[name])
            plan = runs.plans.get(s, {}).get(k, {}).get("step_s")
            sheet = next(
                (
                    p["step_s"]
                    for p in runs.datasheet.get(s, {}).get("plans", [])
                    if p["drives"] == k
                ),
                None,
            )
            said = [
                f"{who} {p:.2f} s ({100 * (p - m) / m:+.1f}%)"
                for who, p in (("study", pred), ("planner", plan), ("datasheet", sheet))
                if p is not None
            ]
            lines.append(f"{s} on {name}: step {m:.2f} s measured; " + ", ".join(said))
    if runs.datasheet_text:
        lines += ["the datasheet's plan (SETS as above):", *runs.datasheet_text.splitlines()]
    return lines


def sweeps_and_study(
    lab: Lab, go_on: Callable[[], None] = lambda: None
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """The study's sweeps, then the study itself (minutes, mostly waiting on the throttled
    drives); *go_on* raises to stop between them."""
    sweeps = _sweeps(lab)
    go_on()
    return sweeps, _study(lab)


def plans_of(lab: Lab, sweeps: dict[str, dict[str, Any]], study: dict[str, Any]) -> LabRuns:
    """The planner's answers from the sweeps and the study: a minute of the guest's CPU and
    no drive, which can go on beside what uses the lab after the study (through its agent
    ``plans``, tests/vm/conftest.py)."""
    return LabRuns(sweeps, study, _plans(lab, study), *_plans_before_purchase(lab, study))


def _plans(lab: Lab, study: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """``iotune estimate --drives 1,2,4`` per strategy, from the single drive's sweep and the
    study's RAM run."""
    ram = ram_run(study)
    out = {}
    for s in STRATEGIES:
        doc = lab.iotune_json(
            "estimate",
            f"tiny_{s}",
            *SET_ARGS,
            # the single drive's sweep, beside the study's folder (lab.share is the agent's)
            *("--aio-config", str(Path(study["dir"]).parent / "sweep-single")),
            *("--baseline", ram["run_dir"]),
            *("--drives", "1,2,4"),
        )
        out[s] = {p["drives"]: p for p in doc["drives"]["plans"]}
    return out


def _plans_before_purchase(
    lab: Lab, study: dict[str, Any]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], str]:
    """``iotune estimate --drives 1,2,4`` per strategy from what a buyer has: the drives'
    datasheet (their throttle, as the key list) and one run on the single drive of the
    optimizer state on NVMe (no sweep, no RAM run); and from that run alone."""
    sheet, alone = {}, {}
    mib_s = BPS // MIB
    drive = f"read={mib_s}MiB/s,write={mib_s}MiB/s"
    for s in STRATEGIES:
        run = runs_by_volume(study, s)["single"]["run_dir"]
        args = ("estimate", f"tiny_{s}", *SET_ARGS, "--baseline", run, "--drives", "1,2,4")
        sheet[s] = lab.iotune_json(*args, "--drive", drive)["drives"]
        alone[s] = lab.iotune_json(*args)["drives"]
    run = runs_by_volume(study, "opt_nvme")["single"]["run_dir"]
    args = ("estimate", "tiny_opt_nvme", "--baseline", run, "--drives", "1,2,4", "--drive", drive)
    text = lab.iotune(*args[:2], *SET_ARGS, *args[2:]).check().stdout
    plan = text[text.find("RAID0 of K") :].rstrip()
    return sheet, alone, f"$ iotune {' '.join(args)}\n{plan}"


def sweep_args(target: str, out: Path) -> list[str]:
    """`iotune sweep-aio`'s arguments for a volume of the lab: the presets' aio block, and
    the swap rehearsal of the model the study runs."""
    return [
        *("sweep-aio", "--target", target),
        *("--block-size", "512K", "--queue-depth", "8", "--threads", "1"),
        *("--single-submit", "false", "--overlap-events", "true"),
        *("--io-size", "16M", "--repeats", "1", "--strategy", "grid"),
        *("--swap-pattern", "tiny_opt_nvme", "--swap-rounds", "1", *SET_ARGS),
        *("--out", str(out)),
    ]


def _sweeps(lab: Lab) -> dict[str, dict[str, Any]]:
    """sweep-aio on each volume at the presets' aio block, with the swap rehearsal. The
    three run side by side: each volume has drives of its own, each drive its own throttle,
    and the guest's CPU is idle while they wait."""
    argvs = {
        name: [
            str(BIN / "iotune"),
            "--json",
            *sweep_args(f"/tmp/{name}", lab.share / f"sweep-{name}"),
        ]
        for name in VOLUMES
    }
    r = lab.guest.run(
        [sys.executable, "-c", TOGETHER, json.dumps(list(argvs.values()))],
        timeout=1800,
        env=lab.env,
    ).check()
    out = {}
    for name, res in zip(argvs, json.loads(r.stdout), strict=True):
        if res["rc"] != 0:
            raise RuntimeError(f"sweep-aio on {name} failed: {res['stderr'][-3000:]}")
        out[name] = json.loads(res["stdout"])
    return out


def _study(lab: Lab) -> dict[str, Any]:
    d = lab.share / "study"
    presets = ",".join(["tiny_opt_ram", *(f"tiny_{s}" for s in STRATEGIES)])
    volumes = [
        a
        for name in VOLUMES
        for a in ("--volume", f"{name}=/tmp/{name},aio={lab.share}/sweep-{name}")
    ]
    r = lab.iotune(
        "--json",
        "study",
        "--presets",
        presets,
        "--steps",
        str(STEPS),
        *SET_ARGS,
        *volumes,
        "--out",
        str(d),
        # a hang detector: the study took up to 834 s quiet on an AVX2-only 2-core host
        # (benchmarks/RESULTS.md, 2026-12-01), 4.3x under the 3600 s it had; a limit sits 5x
        # above the longest seen, and a loaded host stretches the study by half again
        timeout=7200,
    ).check()
    doc = json.loads(r.stdout)
    runs = list(read_records(d / "runs.jsonl"))
    return {"doc": doc, "dir": d, "runs": runs}


@dataclass(frozen=True)
class LostMember:
    #: the drive unplugged from raid0x2
    drive: str
    #: the faulty study's run records: raid0x2's, then the single drive's
    runs: list[dict[str, Any]]


def lose_a_member(lab: Lab, go_on: Callable[[], None] = lambda: None) -> LostMember:
    """After the study, as it breaks raid0x2: a study of tiny_opt_nvme on raid0x2 and
    single, two steps each, whose run on raid0x2 loses one of the array's drives once it
    has initialised (UNPLUG, inside the guest); until both runs are recorded, the guest
    dies or *go_on* raises. Neither volume is CK_OFFLOAD, whose checkpointed runs go on
    beside it (tests/vm/conftest.py)."""
    proc = lab.guest.proc
    d = lab.share / "faulty"
    log = lab.share / "faulty.log"
    lab.guest.spawn(
        [
            str(BIN / "iotune"),
            *("study", "--presets", "tiny_opt_nvme", "--steps", "2", *SET_ARGS),
            *("--volume", "raid0x2=/tmp/raid0x2", "--volume", "single=/tmp/single"),
            *("--out", str(d)),
        ],
        log,
        lab.env,
    )
    lost = lab.names[VOLUMES["raid0x2"][0]]
    steps = d / "runs" / "tiny_opt_nvme@raid0x2" / "steps.jsonl"
    unplugged = lab.guest.run([sys.executable, "-c", UNPLUG, str(steps), lost], timeout=900)
    if unplugged.rc != 0:
        raise RuntimeError(f"unplug failed: {unplugged.stderr}\n{log.read_text()[-3000:]}")
    deadline = time.monotonic() + 900
    runs_file = d / "runs.jsonl"
    while len(runs := list(read_records(runs_file)) if runs_file.exists() else []) < 2:
        go_on()
        if proc is None or proc.poll() is not None:
            raise RuntimeError(f"the guest died during the faulty study:\n{lab.guest.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the faulty study did not end:\n{log.read_text()[-3000:]}")
        time.sleep(2)
    return LostMember(lost, runs)
