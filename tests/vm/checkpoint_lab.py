"""The study's second volume in the lab (tests/vm/study_lab.py): a RAID6 of four drives
(``ckpt``, built with `iotune raid create --level 6`) for the checkpoints of a run that
offloads to the lab's RAID0 of four (XFS, as `raid create` makes it), once the study is done;
the member lost (study_lab.lose_a_member) breaks the RAID0 of two beside these runs. First,
on the healthy array, one step of the study's cut tiny_opt_nvme saved by each of DeepSpeed's
FastPersist writers (``fast``, its swap files copied by iotune's aio copy; ``decoupled``, by
DeepSpeed's copytree: on the guest's CPU, their buffer locked by the aio op), and two ranks
saving one step. Then one traced run saves after each of three steps as snapshots
(``--checkpoint-copy reflink``, on the RAID0) persisted to the RAID6 beside the training
(``--checkpoint-persist``); while the second save's persist copies, one member of the RAID6
is failed (``mdadm --fail``, in the guest, the copy's process held still meanwhile). Then a
run resumes from that persisted save, on the degraded array. Last, two of its saves are
persisted again with every write recorded, and replayed to each point power could be lost
at (tests/vm/powerloss_lab.py)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.vm.powerloss_lab import PowerLoss, record_and_replay
from tests.vm.study_lab import BIN, CK_OFFLOAD_MOUNT, CK_SERIALS, SET_ARGS, Lab

CK_STEPS = 3
#: DeepSpeed's writers other than torch.save, each saving one step on the healthy array with
#: the swap files' copy named: the fast writer (FastFileWriter) with iotune's aio copy, and the
#: decoupled engine, whose process saves with the same writer (forked from the training
#: worker on a CPU: iotune.workers.fastpersist), with DeepSpeed's copytree
WRITERS = {"fast": "aio", "decoupled": "deepspeed"}
#: the save whose persist is being copied while a member fails
FAILED_SAVE = 2
#: the saving run's snapshots, on the RAID0 it offloads to, and their persist folder
SNAPSHOTS, PERSISTED = f"{CK_OFFLOAD_MOUNT}/snap", "/tmp/ckpt/ck"
#: the two-rank run's checkpoint folder, under the RAID6's mount
RANKS_DIR = "ranks2"
#: in the guest: the bytes of the files under a folder (argv[1])
TAG_BYTES = (
    "import pathlib, sys; "
    "print(sum(f.stat().st_size for f in pathlib.Path(sys.argv[1]).rglob('*') if f.is_file()))"
)

#: in the guest: runs argv (its stdout into a file), waits for the persist of save TAG to
#: have its first file in the persist folder (the copy begun: its process loaded the aio
#: op; one persist runs at a time), holds that process still (SIGSTOP), fails a member of
#: the array, lets it go on (SIGCONT), and reports whether the copy was still going on
#: then; argv: the command (JSON), its stdout file, the persist folder, the tag, the
#: array, the member
FAIL_DURING_PERSIST = """
import json, os, signal, subprocess, sys, time
argv, out, dest, tag, array, member = json.loads(sys.argv[1]), *sys.argv[2:7]
folder = os.path.join(dest, tag)

def copier():
    # the copy's process: forked from the guest's zygote (named iot-persist), or started
    # as python -m iotune.workers.persist; not the zygote's client that waits for it
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
        except OSError:
            continue
        ours = b"iotune.workers.persist" in cmd and b"iotune.workers.zygote" not in cmd
        if comm == "iot-persist" or ours:
            return int(pid)
    return None

def begun():
    for top, _, files in os.walk(folder):
        if files:
            return True
    return False

with open(out, "w") as fh:
    p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 3000  # a hang detector: the run takes minutes here
    pid = None
    while pid is None:
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            sys.exit(f"no persist of {tag} seen copying: {p.communicate()[1][-3000:]}")
        # a file of the tag's copy there: the process copying is this tag's
        pid = copier() if begun() else None
        time.sleep(0.005)
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:  # the copy ended first: reported as not during it
        pass
    latest = os.path.join(dest, "latest")
    held = open(latest).read().strip() if os.path.exists(latest) else None
    files = sum(len(f) for _, _, f in os.walk(folder))
    fail = subprocess.run(["mdadm", "--manage", array, "--fail", member],
                          capture_output=True, text=True)
    alive = os.path.exists(f"/proc/{pid}")
    if alive:
        os.kill(pid, signal.SIGCONT)
    _, err = p.communicate(timeout=3000)
print(json.dumps({"rc": p.returncode, "stderr": err[-4000:], "fail_rc": fail.returncode,
                  "fail_stderr": fail.stderr, "during_persist": alive and held != tag,
                  "latest_then": held, "files_then": files}))
"""


@dataclass(frozen=True)
class CheckpointRuns:
    #: the saving run's ``trace --run --json`` document
    saving: dict[str, Any]
    #: what the in-guest script saw: rc, stderr, the fail's rc, whether the persist was
    #: still copying then, the persist folder's latest and the files in the tag's copy then
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
    #: the bytes of the files of each persisted save, summed in the guest after the run
    persisted_bytes: dict[str, int]
    #: two of its saves persisted again under log-writes, and replayed to every point a
    #: crash can leave (tests/vm/powerloss_lab.py)
    powerloss: PowerLoss


def run_checkpoints(lab: Lab, go_on: Callable[[], None] = lambda: None) -> CheckpointRuns:
    """The writers' and the two ranks' saves, the saving run with a member failed during a
    persist, then the run resumed from that persisted save."""
    out = lab.share / "ckpt-run"
    argv = [
        str(BIN / "iotune"),
        *("--json", "trace", "--run", "tiny_opt_nvme", *SET_ARGS),
        *("--nvme-path", CK_OFFLOAD_MOUNT, "--steps", str(CK_STEPS)),
        *("--checkpoint-every", "1", "--checkpoint-copy", "reflink"),
        *("--checkpoint-dir", SNAPSHOTS, "--checkpoint-persist", PERSISTED, "--out", str(out)),
    ]
    # the array's initial resync done: what its members do from here is the saves'
    lab.guest.run(["mdadm", "--wait", "/dev/md/ckpt"], timeout=1200)
    idle = lab.iotune_json("raid", "status", "ckpt")["arrays"][0]
    if idle.get("sync_action") not in (None, "idle"):
        raise RuntimeError(f"the checkpoints' array is still syncing: {idle}")
    writers = {}
    for w, copy in WRITERS.items():
        go_on()
        writers[w] = lab.iotune_json(
            "trace",
            "--run",
            "tiny_opt_nvme",
            *SET_ARGS,
            *("--nvme-path", CK_OFFLOAD_MOUNT, "--steps", "1", "--checkpoint-every", "1"),
            *("--checkpoint-writer", w, "--checkpoint-copy", copy),
            *("--checkpoint-dir", f"/tmp/ckpt/{w}", "--out", str(lab.share / f"ckpt-{w}")),
            timeout=1500,
        )
    go_on()
    ranks = lab.iotune_json(
        "trace",
        "--run",
        "tiny_opt_nvme",
        *SET_ARGS,
        *("--ranks", "2", "--nvme-path", CK_OFFLOAD_MOUNT, "--steps", "1"),
        *("--checkpoint-every", "1", "--checkpoint-dir", f"/tmp/ckpt/{RANKS_DIR}"),
        *("--out", str(lab.share / f"ckpt-{RANKS_DIR}")),
        timeout=1500,
    )

    def tag_bytes(folder: str) -> int:
        return int(
            lab.guest.run([sys.executable, "-c", TAG_BYTES, folder], timeout=120).check().stdout
        )

    ranks_bytes = tag_bytes(f"/tmp/ckpt/{RANKS_DIR}/step1")
    member = lab.names[CK_SERIALS[1]]
    stdout = lab.share / "ckpt-run.json"
    r = lab.guest.run(
        [
            sys.executable,
            "-c",
            FAIL_DURING_PERSIST,
            json.dumps(argv),
            str(stdout),
            PERSISTED,
            f"step{FAILED_SAVE}",
            "/dev/md/ckpt",
            f"/dev/{member}",
        ],
        timeout=3600,
        env=lab.env,
    ).check()
    failure = json.loads(r.stdout)
    if failure["rc"] != 0:
        raise RuntimeError(f"the saving run failed: {failure['stderr']}")
    persisted = {f"step{s}": tag_bytes(f"{PERSISTED}/step{s}") for s in range(1, CK_STEPS + 1)}
    go_on()
    status = lab.iotune_json("raid", "status", "ckpt")
    resumed = lab.iotune_json(
        "trace",
        "--run",
        "tiny_opt_nvme",
        *SET_ARGS,
        *("--nvme-path", CK_OFFLOAD_MOUNT, "--steps", "1", "--checkpoint-copy", "aio"),
        *("--resume-from", f"{PERSISTED}/step{FAILED_SAVE}", "--out", str(lab.share / "resumed")),
        timeout=1500,
    )
    saving = json.loads(stdout.read_text())
    go_on()
    lost_power = record_and_replay(lab, go_on)
    return CheckpointRuns(
        saving, failure, member, resumed, status, writers, idle, ranks, ranks_bytes, persisted,
        lost_power,
    )  # fmt: skip


def checkpoint_summary(runs: CheckpointRuns) -> list[str]:
    """Each run's saves for the log: copy, bytes, blocked and durable seconds, the RAID6's
    members' writes against them; each persist's; the power-loss replay's points."""

    def par(p: dict[str, Any] | None) -> str:
        if not p:
            return ""
        each = ", ".join(f"{n} {m['write']:,}" for n, m in sorted(p["per_member"].items()))
        return f"; members wrote {p['member_write_bytes']:,} ({p['amplification']:.3f}x: {each})"

    out = []
    docs = {**{f"writer {w}": d for w, d in runs.writers.items()}, "ranks 2": runs.ranks}
    docs["saving (persisted)"] = runs.saving
    for name, doc in docs.items():
        ck = doc.get("checkpoints") or {}
        for s in ck.get("saves", []):
            out.append(
                f"{name}, {s['tag']} by {ck.get('copy')}: {s['bytes']:,} bytes, blocked "
                f"{s['blocked_s']:.3f} s, durable {s['durable_s']:.3f} s{par(s.get('parity'))}"
            )
            p = s.get("persist")
            if p:
                out.append(
                    f"  persisted: {p['bytes']:,} bytes, copy {p['copy_s']:.2f} s, durable "
                    f"{p['seconds']:.2f} s after the save, waited {p['waited_s']:.2f} s; "
                    f"its volume wrote {p.get('write_bytes', 0):,}{par(p.get('parity'))}"
                )
    f = runs.failure
    out.append(
        f"member {runs.member} failed during the persist of step{FAILED_SAVE}: "
        f"{f['files_then']} file(s) of it there, latest {f['latest_then']}"
    )
    pl = runs.powerloss
    latest = [p["latest"] for p in pl.points]
    out.append(
        f"power loss: {pl.entries} logged writes, {len(pl.points)} points from the mark "
        f"(entry {pl.mark_at}): latest {latest.count('step1')}x step1 then "
        f"{latest.count('step2')}x step2, {sum(p['problem'] is not None for p in pl.points)} "
        f"with a problem; resumed from entry {pl.resumed_point['entry']} "
        f"({pl.resumed_point['second_files']} file(s) of step2 there)"
    )
    return out
