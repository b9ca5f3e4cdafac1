"""The study's second volume in the lab (tests/vm/study_lab.py): a RAID6 of four drives
(``ckpt``, built with `iotune raid create --level 6`) for the checkpoints of a run that
offloads to the lab's RAID0 of two. First, on the healthy array, one step of the study's cut
tiny_opt_nvme saved by each of DeepSpeed's FastPersist writers (``fast``, ``decoupled``: on the
guest's CPU, their buffer locked by the aio op). Then one traced run saves with torch.save
after each of three steps; while it makes its second save, one member of the RAID6 is failed
(``mdadm --fail``, in the guest, the moment the step before the save is recorded); then a run
resumes from that save, on the degraded array. Before the failure, two ranks save one step on
the healthy array too: the save of several ranks, counted once, against RAID6's parity."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.vm.study_lab import BIN, CK_SERIALS, SET_ARGS, Lab

CK_STEPS = 3
#: DeepSpeed's writers other than torch.save, each saving one step on the healthy array: the
#: fast writer (FastFileWriter), and the decoupled engine, whose process saves with the same
#: writer (forked from the training worker on a CPU: iotune.workers.fastpersist)
WRITERS = ("fast", "decoupled")
#: the save made while a member fails
FAILED_SAVE = 2
#: the two-rank run's checkpoint folder, under the RAID6's mount
RANKS_DIR = "ranks2"
#: in the guest: the bytes of the files under a folder (argv[1])
TAG_BYTES = (
    "import pathlib, sys; "
    "print(sum(f.stat().st_size for f in pathlib.Path(sys.argv[1]).rglob('*') if f.is_file()))"
)

#: in the guest: runs argv (its stdout into a file), waits for the step event before the
#: save FAILED_SAVE, fails a member of the array, and reports whether that save was still
#: being made then; argv: the command (JSON), its steps.jsonl, its stdout file, the array,
#: the member, the step
FAIL_DURING_SAVE = """
import json, os, subprocess, sys, time
argv, steps, out, array, member, step = json.loads(sys.argv[1]), *sys.argv[2:6], int(sys.argv[6])

def events(kind):
    if not os.path.exists(steps):
        return []
    recs = [json.loads(x) for x in open(steps).read().splitlines() if x.strip()]
    return [r for r in recs if r.get("event") == kind and r.get("step") == step]

with open(out, "w") as fh:
    p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 1500
    while not events("step"):
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            sys.exit(f"no step {step} event: {p.communicate()[1][-3000:]}")
        time.sleep(0.02)
    fail = subprocess.run(["mdadm", "--manage", array, "--fail", member],
                          capture_output=True, text=True)
    during = not events("checkpoint")
    _, err = p.communicate(timeout=1500)
print(json.dumps({"rc": p.returncode, "stderr": err[-4000:], "fail_rc": fail.returncode,
                  "fail_stderr": fail.stderr, "during_save": during}))
"""


@dataclass(frozen=True)
class CheckpointRuns:
    #: the saving run's ``trace --run --json`` document
    saving: dict[str, Any]
    #: what the in-guest script saw: rc, stderr, the fail's rc, whether the save was going on
    failure: dict[str, Any]
    #: the member failed
    member: str
    #: the resumed run's document
    resumed: dict[str, Any]
    #: ``iotune raid status ckpt --json`` after the saves
    status: dict[str, Any]
    #: each of WRITERS' run (``trace --run --json``), one step saved on the healthy array
    writers: dict[str, dict[str, Any]]
    #: ``iotune raid status ckpt --json``'s array before the saves, its resync done
    built: dict[str, Any]
    #: two ranks (DeepSpeed's launcher, each forked from the guest's zygote), one step saved
    #: on the healthy array (``trace --run --ranks 2 --json``)
    ranks: dict[str, Any]
    #: the bytes of the files in that save's tag folder, summed in the guest (as ``du -b``
    #: counts them, less the folders)
    ranks_tag_bytes: int


def run_checkpoints(lab: Lab, go_on: Callable[[], None] = lambda: None) -> CheckpointRuns:
    """The saving run with a member failed during a save, then the run resumed from it."""
    out = lab.share / "ckpt-run"
    argv = [
        str(BIN / "iotune"),
        *("--json", "trace", "--run", "tiny_opt_nvme", *SET_ARGS),
        *("--nvme-path", "/tmp/raid0x2", "--steps", str(CK_STEPS)),
        *("--checkpoint-every", "1", "--checkpoint-dir", "/tmp/ckpt/ck", "--out", str(out)),
    ]
    # the array's initial resync done: what its members do from here is the saves'
    lab.guest.run(["mdadm", "--wait", "/dev/md/ckpt"], timeout=1200)
    idle = lab.iotune_json("raid", "status", "ckpt")["arrays"][0]
    if idle.get("sync_action") not in (None, "idle"):
        raise RuntimeError(f"the checkpoints' array is still syncing: {idle}")
    writers = {}
    for w in WRITERS:
        go_on()
        writers[w] = lab.iotune_json(
            "trace",
            "--run",
            "tiny_opt_nvme",
            *SET_ARGS,
            *("--nvme-path", "/tmp/raid0x2", "--steps", "1", "--checkpoint-every", "1"),
            *("--checkpoint-writer", w, "--checkpoint-dir", f"/tmp/ckpt/{w}"),
            *("--out", str(lab.share / f"ckpt-{w}")),
            timeout=1500,
        )
    go_on()
    ranks = lab.iotune_json(
        "trace",
        "--run",
        "tiny_opt_nvme",
        *SET_ARGS,
        *("--ranks", "2", "--nvme-path", "/tmp/raid0x2", "--steps", "1"),
        *("--checkpoint-every", "1", "--checkpoint-dir", f"/tmp/ckpt/{RANKS_DIR}"),
        *("--out", str(lab.share / f"ckpt-{RANKS_DIR}")),
        timeout=1500,
    )
    tag_bytes = int(
        lab.guest.run(
            [sys.executable, "-c", TAG_BYTES, f"/tmp/ckpt/{RANKS_DIR}/step1"], timeout=120
        )
        .check()
        .stdout
    )
    member = lab.names[CK_SERIALS[1]]
    stdout = lab.share / "ckpt-run.json"
    r = lab.guest.run(
        [
            sys.executable,
            "-c",
            FAIL_DURING_SAVE,
            json.dumps(argv),
            str(out / "steps.jsonl"),
            str(stdout),
            "/dev/md/ckpt",
            f"/dev/{member}",
            str(FAILED_SAVE),
        ],
        timeout=1800,
        env=lab.env,
    ).check()
    failure = json.loads(r.stdout)
    if failure["rc"] != 0:
        raise RuntimeError(f"the saving run failed: {failure['stderr']}")
    go_on()
    status = lab.iotune_json("raid", "status", "ckpt")
    resumed = lab.iotune_json(
        "trace",
        "--run",
        "tiny_opt_nvme",
        *SET_ARGS,
        *("--nvme-path", "/tmp/raid0x2", "--steps", "1"),
        *("--resume-from", f"/tmp/ckpt/ck/step{FAILED_SAVE}", "--out", str(lab.share / "resumed")),
        timeout=1500,
    )
    saving = json.loads(stdout.read_text())
    return CheckpointRuns(saving, failure, member, resumed, status, writers, idle, ranks, tag_bytes)
