"""Root tier: saves taken as snapshots and persisted beside the training
(`--checkpoint-copy reflink --checkpoint-persist DIR`, iotune/workers/persist.py), in a real
DeepSpeed ZeRO-3 run on the CPU, traced. The snapshots are clones on the offload volume (XFS);
a process of their own copies each into the persist folder on a volume of its own (ext4 here)
by the aio copy while the next step trains. Each persisted save is its snapshot to the byte,
the persist folder's latest names the last save and each snapshot is gone from the offload
volume once persisted, and a run resumed from the persist folder continues the loss."""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.root.conftest import LoopDevices, iotune

pytestmark = pytest.mark.beside_study


def _mounted(devs: LoopDevices, size_mib: int, fs: str) -> Path:
    dev = devs(size_mib=size_mib, fs=fs, mount=True)
    Path(f"/sys/block/{Path(dev).name}/queue/max_sectors_kb").write_text("512")
    return devs.mounts[-1]


def _files(folder: Path) -> dict[str, int]:
    return {str(f.relative_to(folder)): f.stat().st_size for f in folder.rglob("*") if f.is_file()}


@pytest.fixture(scope="module")
def persisted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Three steps, a save after each, snapshots on the XFS offload volume persisted to an
    ext4 one; then two steps resumed from the persist folder's first save."""
    devs = LoopDevices(tmp_path_factory.mktemp("persist"))
    try:
        xfs = _mounted(devs, 2048, "xfs")
        ext4 = _mounted(devs, 1536, "ext4")
        (xfs / "off").mkdir()
        run = iotune("--json", "trace", "--run", "tiny_opt_nvme", "--nvme-path", str(xfs / "off"),
                     "--steps", "3", "--checkpoint-every", "1", "--checkpoint-copy", "reflink",
                     "--checkpoint-dir", str(xfs / "snap"), "--checkpoint-persist", str(ext4 / "ck"),
                     "--out", str(devs.tmp / "run"))  # fmt: skip
        after = {"snap": sorted(p.name for p in (xfs / "snap").iterdir()),
                 "ck": {t: _files(ext4 / "ck" / t) for t in ("step1", "step2", "step3")}}  # fmt: skip
        resumed = iotune("--json", "run", "tiny_opt_nvme", "--nvme-path", str(xfs / "off"),
                         "--steps", "2", "--resume-from", str(ext4 / "ck" / "step1"), "--checkpoint-copy",
                         "aio", "--out", str(devs.tmp / "resumed"))  # fmt: skip
        yield {
            "run": json.loads(run.stdout),
            "resumed": json.loads(resumed.stdout),
            "xfs": xfs,
            "ck": ext4 / "ck",
            "after": after,
        }
    finally:
        devs.close()


def test_each_save_is_persisted_to_the_byte_and_its_snapshot_removed(
    persisted: dict[str, Any],
) -> None:
    doc, ck = persisted["run"], persisted["ck"]
    n_s = doc["estimate"]["swapped"]["n_s"]
    saves = doc["checkpoints"]["saves"]
    assert [s["tag"] for s in saves] == ["step1", "step2", "step3"]
    # a clone: the swap files' size on disk, and none of their bytes moved by the drives
    est = doc["checkpoints"]["estimate"]
    assert est == {"bytes": 12 * n_s, "read_bytes": 0, "write_bytes": 0, "exact": True}, est
    for s in saves:  # DeepSpeed's two small pickles and the file system's log at most
        assert s["checkpoint_write_bytes"] <= 4 * 1024 * 1024, s
        assert s["offload_read_bytes"] <= 1024 * 1024, s
    for s in saves:
        p = s["persist"]
        held = persisted["after"]["ck"][s["tag"]]
        # the whole tag: DeepSpeed's two pickles and the clone of the three swap files, each
        # 4 bytes a swapped parameter, as the snapshot held them
        assert p["files"] == len(held) and p["bytes"] == sum(held.values()), (p, held)
        swap = sum(v for k, v in held.items() if k.startswith("offloaded_tensors/rank00/"))
        assert swap == 12 * n_s == s["swap_copy_bytes"], (swap, n_s)
        assert p["dir"] == str(ck) and 0 <= p["waited_s"] <= p["seconds"], p
        assert 0 < p["copy_s"] < p["seconds"], p
    # the persist folder's latest names the last save; the snapshots were removed from the
    # offload volume once persisted, and the snapshot folder has no latest of its own
    assert (ck / "latest").read_text() == "step3"
    # left in the snapshot folder: DeepSpeed's scripts beside the tags, persisted too
    assert persisted["after"]["snap"] == ["zero_to_fp32.py", "zero_to_torch.py"]
    assert (ck / "zero_to_fp32.py").is_file() and (ck / "zero_to_torch.py").is_file()
    losses = json.loads((ck / "iotune-losses.json").read_text())["losses"]
    assert sorted(losses) == ["1", "2", "3"], losses


def test_the_steps_after_a_save_train_beside_its_persist_and_the_next_save_waits(
    persisted: dict[str, Any],
) -> None:
    """The copy runs in its own process: the step after each save starts while it does
    (the copy's process alone takes seconds to load DeepSpeed's op), and the next save
    waits for it before its own blocked time, which is the clone's."""
    doc = persisted["run"]
    steps = [e for e in doc["events"] if e["event"] == "step"]
    assert [e.get("persist_beside", False) for e in steps] == [False, True, True], steps
    checkpoints = [e for e in doc["events"] if e["event"] == "checkpoint"]
    assert "persist_wait_s" not in checkpoints[0]
    for e in checkpoints[1:]:
        assert e["persist_wait_s"] >= 0, e


def test_each_persists_writes_are_traced_on_its_own_volume(persisted: dict[str, Any]) -> None:
    """The persist volume is traced beside the offload volume: each persist's copy is what
    its drive wrote from the save's end to the wait for it (the step after, the wait), at
    least the persisted bytes, more only by ext4's journal and metadata; none of it in the
    save's own interval, whose writes are the clone's on the offload volume."""
    doc = persisted["run"]
    ck = doc["checkpoints"]
    (drive,) = ck["persist_drives"]
    assert drive not in ck["offload_drives"] and drive not in ck["checkpoint_drives"], ck
    for s in ck["saves"]:
        p = s["persist"]
        step = int(s["tag"].removeprefix("step"))
        want = ([f"step:{step + 1}"] if step < 3 else []) + [f"persist:{step}"]
        assert p["intervals"] == want, p
        assert p["bytes"] <= p["write_bytes"] <= p["bytes"] + 4 * 1024 * 1024, p
        # an ext4 on one loop device: no parity
        assert p["parity"] is None
    # the save's own interval: not the copy's (it starts after it); at most the run's
    # losses file and the journal, written back when the kernel chooses
    rows = {r["label"]: r for r in doc["io_steps"]}
    for s in ck["saves"]:
        assert rows[f"checkpoint:{s['step']}"]["drives"][drive]["write"] <= 64 * 1024, s["tag"]
    # the steps beside a copy: their rows count the offload volume's drives apart, so the
    # run's table of steps holds none of the copy's writes to the persist volume
    for label in ("step:1", "step:2", "step:3"):
        r = rows[label]
        offload = sum(r["drives"][d]["write"] for d in ck["offload_drives"])
        assert r["primary"]["write"]["diskstats_bytes"] == offload, r
        assert r["write"]["diskstats_bytes"] == offload + r["drives"][drive]["write"], r
    steady = next(x for x in doc["table"] if x["case"].startswith("steady step"))
    later = [rows[f"step:{k}"]["primary"]["write"]["bytes"] for k in (2, 3)]
    assert steady["write_bytes"] == int(statistics.median(later)), (steady, later)


def test_the_report_shows_the_persists_beside_the_saves(
    persisted: dict[str, Any], tmp_path: Path
) -> None:
    """`iotune report` of the persisted run: its "Persisted saves" row names the persist
    folder and the drive it was traced on, three persists, and what that drive wrote."""
    doc = persisted["run"]
    out = tmp_path / "report"
    iotune("report", doc["out"], "--out", str(out))
    md = (out / "report.md").read_text()
    assert "## Persisted saves" in md, md
    (row,) = [line for line in md.splitlines() if f"| {persisted['ck']} |" in line]
    (drive,) = doc["checkpoints"]["persist_drives"]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "3" and cells[7] == drive, cells
    written = statistics.median(s["persist"]["write_bytes"] for s in doc["checkpoints"]["saves"])
    assert cells[6] == f"{written / 2**30:.3f}", (cells, written)


def test_the_persisted_copy_is_direct(persisted: dict[str, Any]) -> None:
    """O_DIRECT through DeepSpeed's op: none of the persisted swap files is in the page
    cache but for a last part of a page (fincore)."""
    held = persisted["ck"] / "step3" / "offloaded_tensors" / "rank00"
    files = [f for f in held.rglob("*") if f.is_file()]
    assert len(files) == 3
    for f in files:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(f)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        assert int(out.split()[0]) <= 4096, (f, out)


def test_a_run_resumed_from_the_persist_folder_continues_the_loss(
    persisted: dict[str, Any],
) -> None:
    """Both steps to the bit: the weights (step 2) and Adam's state (step 3) came back
    from the persisted snapshot."""
    doc = persisted["resumed"]
    assert doc["resumed_at"] == 1
    check = doc["resume_check"]
    assert check["ok"] is True and check["rel_diff"] == 0.0, check
    assert [s["at_step"] for s in check["steps"]] == [2, 3], check
    init = next(e for e in doc["events"] if e["event"] == "init")
    assert init["adam_restored"] >= 1, init
    (rec,) = init["resume_copy"]
    assert rec["source"] == str(persisted["ck"] / "step1" / "offloaded_tensors" / "rank00")


def test_a_persist_that_cannot_work_is_refused_in_one_line(persisted: dict[str, Any]) -> None:
    """Before anything runs: a persist of saves that are not snapshots, and one onto the
    snapshots' own volume."""
    xfs = persisted["xfs"]
    for copy, dest, want, hint in (
        ("aio", persisted["ck"] / "refused", "--checkpoint-persist copies each save's snapshot, "
         "which --checkpoint-copy reflink takes; this run's saves copy the swap files by aio",
         "--checkpoint-copy reflink"),
        ("reflink", xfs / "refused", f"--checkpoint-persist {xfs / 'refused'} is on the volume "
         "of the snapshots", "a volume of its own"),
    ):  # fmt: skip
        p = iotune("run", "tiny_opt_nvme", "--nvme-path", str(xfs / "off"), "--steps", "1",
                   "--checkpoint-every", "1", "--checkpoint-dir", str(xfs / "snap2"),
                   "--checkpoint-copy", copy, "--checkpoint-persist", str(dest),
                   check=False)  # fmt: skip
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 2 and "Traceback" not in p.stderr, p.stderr
        assert want in lines[0] and hint in lines[1], p.stderr
        assert not dest.exists() and not (xfs / "snap2").exists()


def test_two_ranks_persist_each_save_once_whole(tmp_path_factory: pytest.TempPathFactory) -> None:
    """--ranks 2 x --checkpoint-persist: each rank clones its own swap files into the
    snapshot, and local rank 0 persists the whole tag once every rank has sealed it (a
    barrier): one persist a save, both ranks' swap files in it, each to the byte as the
    snapshot held it; latest names the last save, and no snapshot is left."""
    devs = LoopDevices(tmp_path_factory.mktemp("persist-ranks"))
    try:
        xfs = _mounted(devs, 2048, "xfs")
        ext4 = _mounted(devs, 1536, "ext4")
        (xfs / "off").mkdir()
        run = iotune("--json", "trace", "--run", "tiny_opt_nvme", "--ranks", "2", "--nvme-path",
                     str(xfs / "off"), "--steps", "2", "--checkpoint-every", "1",
                     "--checkpoint-copy", "reflink", "--checkpoint-dir", str(xfs / "snap"),
                     "--checkpoint-persist", str(ext4 / "ck"), "--out", str(devs.tmp / "run"))  # fmt: skip
        doc = json.loads(run.stdout)
        assert doc["ranks"] == 2 and doc["steps_done"] == 2, doc.get("error")
        n_s = doc["estimate"]["swapped"]["n_s"]
        persists = [e for e in doc["events"] if e["event"] == "persist"]
        assert [(e["step"], e["tag"]) for e in persists] == [(1, "step1"), (2, "step2")]
        for s in doc["checkpoints"]["saves"]:
            held = _files(ext4 / "ck" / s["tag"])
            p = s["persist"]
            assert p["files"] == len(held) and p["bytes"] == sum(held.values()) == s["bytes"]
            for rank in ("rank00", "rank01"):
                swap = sum(v for k, v in held.items() if k.startswith(f"offloaded_tensors/{rank}/"))
                assert swap == 12 * n_s, (rank, swap, n_s)
            assert s["swap_copy_bytes"] == 2 * 12 * n_s, s
            # the copy starts once every rank has sealed the save; the tracer may mark the
            # last rank's save a poll later, so its first writes can fall in the save's row
            rows = {r["label"]: r for r in doc["io_steps"]}
            (drive,) = doc["checkpoints"]["persist_drives"]
            early = rows[f"checkpoint:{s['step']}"]["drives"][drive]["write"]
            assert p["bytes"] <= p["write_bytes"] + early <= p["bytes"] + 4 * 1024 * 1024, p
        assert (ext4 / "ck" / "latest").read_text() == "step2"
        assert not any(p.name.startswith("step") for p in (xfs / "snap").iterdir())
    finally:
        devs.close()


def test_a_persist_folder_the_tracer_cannot_resolve_is_persisted_untraced_with_a_note(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A persist folder on a file system with no block device (tmpfs here, NFS alike) is
    persisted all the same, each save to the byte; the run says in a note that it was not
    traced, and the persist's record has no drive figures rather than wrong ones."""
    devs = LoopDevices(tmp_path_factory.mktemp("persist-tmpfs"))
    mem = devs.tmp / "mem"
    mem.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(mem)], check=True)
    try:
        xfs = _mounted(devs, 2048, "xfs")
        (xfs / "off").mkdir()
        run = iotune("--json", "trace", "--run", "tiny_opt_nvme", "--nvme-path", str(xfs / "off"),
                     "--steps", "1", "--checkpoint-every", "1", "--checkpoint-copy", "reflink",
                     "--checkpoint-dir", str(xfs / "snap"), "--checkpoint-persist", str(mem / "ck"),
                     "--out", str(devs.tmp / "run"))  # fmt: skip
        doc = json.loads(run.stdout)
        assert doc["steps_done"] == 1, doc.get("error")
        notes = [n for n in doc["notes"] if n.startswith(f"--checkpoint-persist {mem / 'ck'}")]
        assert len(notes) == 1 and "not traced" in notes[0], doc["notes"]
        assert doc["checkpoints"]["persist_drives"] == [], doc["checkpoints"]
        (save,) = doc["checkpoints"]["saves"]
        p = save["persist"]
        held = _files(mem / "ck" / "step1")
        assert p["files"] == len(held) and p["bytes"] == sum(held.values()) == save["bytes"], p
        assert p.get("write_bytes") is None and p.get("parity") is None, p
        assert (mem / "ck" / "latest").read_text() == "step1"
    finally:
        devs.close()
        subprocess.run(["umount", str(mem)], check=False)
