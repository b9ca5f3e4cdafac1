"""Power lost during a save, in the lab's guest (tests/vm/study_lab.py), after the
checkpoints' runs (tests/vm/checkpoint_lab.py): the persist's copy (iotune.workers.persist,
what ``--checkpoint-persist`` runs beside the training) recorded write by write, and the
volume replayed to every point a crash can leave it at, as xfstests does.

In the guest: an XFS on device-mapper's ``log-writes`` target (LW0 the volume, LW1 its log);
the saving run's losses file written there as the run writes it; then two saves of that run
(its persisted step1 and step2, each first put back as a snapshot on the RAID0) persisted
into it one after the other, a mark after the first (``saved1``) and after the second. On
the host: the log replayed (tests/logwrites.py) onto an image, and at the mark and at every
flush and FUA write after it, the image mounted (XFS recovers its log as after a crash) and
what ``latest`` names there compared, file by file, with the save it names. The point where
the second save's copy was furthest along while ``latest`` still named the first goes back
into the guest (LW2) and a run resumes from it."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.logwrites import Replay, copy_into, points
from tests.vm.study_lab import CK_OFFLOAD_MOUNT, LW_MIB, LW_SERIALS, SET_ARGS, ZYGOTE, Lab

#: the mark set once the first save is persisted
MARK = "saved1"
TAGS = ("step1", "step2")

#: in the guest: each file under a folder (argv[1]), relative, with its size and sha256
DIGESTS = """
import hashlib, json, pathlib, sys
top = pathlib.Path(sys.argv[1])
print(json.dumps({str(f.relative_to(top)): [f.stat().st_size,
                  hashlib.sha256(f.read_bytes()).hexdigest()]
                  for f in sorted(top.rglob("*")) if f.is_file()}))
"""


@dataclass(frozen=True)
class PowerLoss:
    #: each point replayed: the log's entry, what latest named, what was wrong (None: the
    #: save latest names is whole), the files of the second save there then
    points: list[dict[str, Any]]
    #: the log's entries and the index of the mark
    entries: int
    mark_at: int
    #: the point put back into the guest, and the run resumed from it
    resumed_point: dict[str, Any]
    resumed: dict[str, Any]
    #: each save's files as the saving run persisted them: {tag: {file: [size, sha256]}}
    sources: dict[str, dict[str, list[Any]]]


def _digests(folder: Path) -> dict[str, list[Any]]:
    return {
        str(f.relative_to(folder)): [f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest()]
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


def _look(image: Path, where: Path, sources: dict[str, dict[str, list[Any]]]) -> dict[str, Any]:
    """Mount a copy of the volume at one point (its log recovered) and compare the save its
    latest names with the saving run's."""
    subprocess.run(["mount", "-o", "loop,nouuid", str(image), str(where)], check=True)
    try:
        ck = where / "ck"
        latest = (ck / "latest").read_text().strip() if (ck / "latest").exists() else None
        second = _digests(ck / TAGS[1]) if (ck / TAGS[1]).is_dir() else {}
        whole = second == sources[TAGS[1]]
        problem = None
        if latest not in sources:
            problem = f"latest names {latest!r}"
        else:
            held = _digests(ck / latest)
            want = sources[latest]
            bad = sorted(f for f in held.keys() | want.keys() if held.get(f) != want.get(f))
            if bad:
                problem = f"{latest} differs from the saved one in {len(bad)} file(s): {bad[:4]}"
        if not (ck / "iotune-losses.json").is_file():
            problem = problem or "the losses file is gone"
        return {"latest": latest, "problem": problem, "second_files": len(second),
                "second_whole": whole}  # fmt: skip
    finally:
        subprocess.run(["umount", str(where)], check=True)


def record_and_replay(lab: Lab, go_on: Callable[[], None] = lambda: None) -> PowerLoss:
    """After run_checkpoints: record two persists under log-writes, replay every point."""
    g, env = lab.guest, lab.env
    dev = {s: f"/dev/{lab.names[s]}" for s in LW_SERIALS}
    persisted = "/tmp/ckpt/ck"
    sources = {
        t: json.loads(g.run([sys.executable, "-c", DIGESTS, f"{persisted}/{t}"], timeout=600)
                      .check().stdout)
        for t in TAGS
    }  # fmt: skip
    g.run(["modprobe", "dm-log-writes"]).check()
    sectors = g.run(["blockdev", "--getsz", dev["LW0"]]).check().stdout.strip()
    table = f"0 {sectors} log-writes {dev['LW0']} {dev['LW1']}"
    g.run(["dmsetup", "create", "iotlw", "--table", table]).check()
    # its node by the kernel's name (dm-N, devtmpfs's): no udev in the guest to make
    # /dev/mapper's link for certain
    info = ["dmsetup", "info", "-c", "--noheadings", "-o", "blkdevname", "iotlw"]
    logged = "/dev/" + g.run(info).check().stdout.strip()
    g.run(["mkfs.xfs", "-q", "-f", logged], timeout=1200).check()
    g.run(["mkdir", "-p", "/tmp/lw", "/tmp/lwr"]).check()
    g.run(["mount", logged, "/tmp/lw"]).check()
    g.run(["mkdir", "/tmp/lw/ck"]).check()
    # the saving run's losses, written there as the run writes them (beside the first save)
    g.run(["cp", f"{persisted}/iotune-losses.json", "/tmp/lw/ck/"]).check()
    g.run(["sync", "-f", "/tmp/lw/ck/iotune-losses.json"]).check()
    for i, tag in enumerate(TAGS):
        go_on()
        # the save as a snapshot on the offload volume, which the persist reads O_DIRECT
        # and removes once persisted
        snap = f"{CK_OFFLOAD_MOUNT}/lwsnap{i}"
        g.run(["mkdir", "-p", snap]).check()
        g.run(["cp", "-a", f"{persisted}/{tag}", snap], timeout=1200).check()
        copy = [sys.executable, "-m", "iotune.workers.zygote", "client", ZYGOTE]
        copy += ["iotune.workers.persist", snap, "/tmp/lw/ck", tag, "{}"]
        g.run(copy, timeout=1800, env=env).check()
        if i == 0:
            g.run(["dmsetup", "message", "iotlw", "0", "mark", MARK]).check()
    g.run(["umount", "/tmp/lw"]).check()
    g.run(["dmsetup", "remove", "iotlw"]).check()
    go_on()

    # on the host: the log drive's image, as QEMU wrote it
    image_of = {d.serial: g.workdir / f"nvme{i}-{d.serial}.img" for i, d in enumerate(g.drives)}
    work = Path(tempfile.mkdtemp(prefix="iotune-powerloss-", dir=g.workdir))
    replay = Replay(image_of["LW1"], work / "volume.img", LW_MIB << 20)
    at = points(replay.entries, MARK)
    mnt = work / "mnt"
    mnt.mkdir()
    seen, chosen = [], None
    for index in at:
        replay.to(index)
        point = work / "point.img"
        replay.copy(point)
        look = _look(point, mnt, sources)
        seen.append({"entry": index, **look})
        # the furthest point of the second save's copy before latest names it: kept
        if look["latest"] == TAGS[0] and look["problem"] is None:
            chosen = {"entry": index, "second_files": look["second_files"]}
            point.replace(work / "chosen.img")
        else:
            point.unlink()
    mark_at = next(e.index for e in replay.entries if e.mark == MARK)
    if chosen is None:
        raise RuntimeError(f"no point with {TAGS[0]} whole and latest naming it: {seen}")
    # back into the guest, on a drive of its own (written in place: QEMU holds its image
    # open; never written before, it is zeros elsewhere), and a run resumed from it
    copy_into(work / "chosen.img", image_of["LW2"])
    g.run(["blockdev", "--flushbufs", dev["LW2"]]).check()
    g.run(["mount", "-o", "nouuid", dev["LW2"], "/tmp/lwr"]).check()
    resumed = lab.iotune_json(
        "trace",
        "--run",
        "tiny_opt_nvme",
        *SET_ARGS,
        *("--nvme-path", CK_OFFLOAD_MOUNT, "--steps", "1", "--checkpoint-copy", "aio"),
        *("--resume-from", f"/tmp/lwr/ck/{TAGS[0]}", "--out", str(lab.share / "powerloss")),
        timeout=1500,
    )
    g.run(["umount", "/tmp/lwr"]).check()
    return PowerLoss(seen, len(replay.entries), mark_at, chosen, resumed, sources)
