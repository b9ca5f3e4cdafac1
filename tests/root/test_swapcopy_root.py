"""Root tier: the swap files' copy of a save and of a resume by iotune (`--checkpoint-copy
aio|reflink`, iotune/workers/swapcopy.py), in real DeepSpeed ZeRO-3 runs on the CPU, traced:
through DeepSpeed's async I/O op between two ext4 volumes, and by reflink within one XFS
volume. Each copy is the swap folder to the byte, each resumed run continues the saving run's
loss (iotune's own check), and each copy shows how it was made: the aio copy's requests at the
op's block size, the clone's extents shared with the swap files it was taken from."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.root.conftest import IOTUNE, LoopDevices, iotune
from tests.root.fswrites import traced_run as _run

pytestmark = pytest.mark.beside_study

KIB, MIB = 1 << 10, 1 << 20


def _mounted(devs: LoopDevices, size_mib: int, fs: str) -> tuple[str, Path]:
    dev = devs(size_mib=size_mib, fs=fs, mount=True)
    Path(f"/sys/block/{Path(dev).name}/queue/max_sectors_kb").write_text("512")
    return Path(dev).name, devs.mounts[-1]


def _du(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """aio: three steps saved from one ext4 volume into another, then two steps resumed from
    the first save (the second of them shows Adam's state came back, not only the weights);
    reflink: the same within one XFS volume, the swap files kept."""
    devs = LoopDevices(tmp_path_factory.mktemp("swapcopy"))
    try:
        off_dev, off = _mounted(devs, 1024, "ext4")
        ck_dev, ck = _mounted(devs, 1536, "ext4")  # three saves of 0.32 GiB, and room for one more
        # the swap files kept, and three saves of them, counted as copies (the clones share)
        xfs_dev, xfs = _mounted(devs, 2048, "xfs")
        tmp = devs.tmp
        for sub in ("off", "off2"):  # each run's offload folder on the one XFS volume
            (xfs / sub).mkdir()
        aio = ("--checkpoint-copy", "aio")
        reflink = ("--checkpoint-copy", "reflink", "--force")  # checkpoints on the offload
        doc = {
            "aio": _run(tmp / "aio", off, "--steps", "3", "--checkpoint-every", "1",
                        "--checkpoint-dir", str(ck / "ck"), *aio),
            "aio_resumed": _run(tmp / "aio-resumed", off, "--steps", "2",
                                "--resume-from", str(ck / "ck" / "step1"), *aio),
            "reflink": _run(tmp / "reflink", xfs / "off", "--steps", "3", "--checkpoint-every", "1",
                            "--checkpoint-dir", str(xfs / "ck"), "--keep-swap", *reflink),
            "reflink_resumed": _run(tmp / "reflink-resumed", xfs / "off2", "--steps", "2",
                                    "--resume-from", str(xfs / "ck" / "step1"), *reflink),
        }  # fmt: skip
        yield {**doc, "ck": ck, "off": off, "xfs": xfs, "devs": (off_dev, ck_dev, xfs_dev)}
    finally:
        devs.close()


def _saves(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["events"] if e["event"] == "checkpoint"]


@pytest.mark.parametrize("copy", ["aio", "reflink"])
def test_each_save_is_copied_by_iotune_to_the_byte(copies: dict[str, Any], copy: str) -> None:
    doc = copies[copy]
    n_s = doc["estimate"]["swapped"]["n_s"]
    folder = (copies["ck"] if copy == "aio" else copies["xfs"]) / "ck"
    saves = _saves(doc)
    assert [s["tag"] for s in saves] == ["step1", "step2", "step3"]
    for s in saves:
        assert s["copy"] == copy
        (rec,) = s["swap_copy"]  # one rank: one swap folder copied
        assert rec["copy"] == copy and rec["target"].endswith("offloaded_tensors/rank00")
        # fp32 master and Adam's two moments, 4 bytes a swapped parameter each: the record,
        # the folder's files after the run, and the save's own count of them
        held = folder / s["tag"] / "offloaded_tensors" / "rank00"
        assert rec["bytes"] == 12 * n_s == _du(held) == s["swap_copy_bytes"]
        assert rec["files"] == len([f for f in held.rglob("*") if f.is_file()])
        assert 0 <= rec["durable_s"] <= rec["seconds"] <= s["blocked_s"] <= s["durable_s"]


def test_the_aio_copy_is_direct_at_the_ops_block(copies: dict[str, Any]) -> None:
    """O_DIRECT through DeepSpeed's op: each save reads the swap files from the offload
    volume and writes them to the checkpoint volume in requests of the op's block (512 KiB
    here) but for each file's last request, request for request (the trace, both drives),
    and the copy is not in the page cache (fincore) but for a last part of a page."""
    doc = copies["aio"]
    n_s = doc["estimate"]["swapped"]["n_s"]
    block = int(doc["aio"]["block_size"])
    for s in doc["checkpoints"]["saves"]:
        wrote = {int(k): n for k, n in s["checkpoint_write_sizes"].items()}
        read = {int(k): n for k, n in s["offload_read_sizes"].items()}
        # the three swap files' whole blocks, read and written; the rest, their last requests
        assert wrote[block] == read[block], (wrote, read)
        assert 12 * n_s - 3 * block < wrote[block] * block <= 12 * n_s, (wrote, read)
    held = copies["ck"] / "ck" / "step2" / "offloaded_tensors" / "rank00"
    for f in (f for f in held.rglob("*") if f.is_file()):
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(f)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        # the last part of a 4 KiB unit goes through the page cache: one page at most
        assert int(out.split()[0]) <= 4096, (f, out)


def test_a_clone_shares_the_swap_files_extents(copies: dict[str, Any]) -> None:
    """The last save's clone and the swap files it was taken from (kept, not written
    since) share their extents: the clone took no space of its own (XFS, FIEMAP's shared
    flag by filefrag)."""
    ck = copies["xfs"] / "ck" / "step3" / "offloaded_tensors" / "rank00"
    files = sorted(f for f in ck.rglob("*") if f.is_file() and f.stat().st_size)
    assert files
    for f in files:
        out = subprocess.run(["filefrag", "-v", str(f)], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
        extents = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
        assert extents and all("shared" in line for line in extents), out


@pytest.mark.parametrize("copy", ["aio", "reflink"])
def test_a_run_resumed_through_the_copy_continues_the_loss(
    copies: dict[str, Any], copy: str
) -> None:
    """Both steps the two runs trained, to the bit (one CPU, the same batches): the first
    resumed step's loss shows the weights came back, the second's Adam's moments and step
    count, which DeepSpeed's load of an NVMe-offloaded optimizer leaves out and iotune puts
    back (iotune.workers.checkpoints.restore_swapped_adam: the init record's count)."""
    doc = copies[f"{copy}_resumed"]
    assert doc["resumed_at"] == 1
    check = doc["resume_check"]
    assert check["ok"] is True and check["rel_diff"] == 0.0, check
    assert [s["at_step"] for s in check["steps"]] == [2, 3], check
    saving = {e["step"]: e["loss"] for e in copies[copy]["events"] if e["event"] == "step"}
    resumed = {e["global_step"]: e["loss"] for e in doc["events"] if e["event"] == "step"}
    assert resumed == {2: saving[2], 3: saving[3]}, (resumed, saving)
    init = next(e for e in doc["events"] if e["event"] == "init")
    assert init["adam_restored"] >= 1, init
    (rec,) = init["resume_copy"]
    n_s = doc["estimate"]["swapped"]["n_s"]
    assert rec["copy"] == copy and rec["bytes"] == 12 * n_s
    # the resume's initialisation and first step on the offload volume, by hand: a fresh
    # start's (4N read, 8N written), the copy back (12N written; a clone none), DeepSpeed's
    # reload of the master (4N, 4N) and a first step that reads Adam's moments back (a
    # steady step's 12N + 4N_g each way); the drives against it, as traced
    n_g = doc["estimate"]["swapped"]["n_g"]
    copied = 0 if copy == "reflink" else 12 * n_s
    want = (20 * n_s + 4 * n_g, 24 * n_s + copied + 4 * n_g)
    est = next(r for r in doc["estimate_table"] if r["case"] == "estimate: init + first step")
    assert (est["read_bytes"], est["write_bytes"]) == want, (est, want)
    got = next(r for r in doc["table"] if r["case"] == "init + first step")
    assert want[0] <= got["read_bytes"] <= want[0] + 64 * KIB, (got, want)
    # beyond the model's data, the file system's own writes (ext4's journal commits every 5 s:
    # a slower run holds more of them), bounded by the kernel's count over the whole run
    own = doc["fs_own_writes"]
    assert -256 * KIB <= got["write_bytes"] - want[1] <= 256 * KIB + own["bytes"], (got, want, own)
    assert any(n.startswith("resumed: the estimate's initialisation") for n in doc["notes"])
    assert rec["source"].endswith("step1/offloaded_tensors/rank00")


def test_a_copy_that_cannot_be_made_is_refused_in_one_line(copies: dict[str, Any]) -> None:
    """Before anything runs: reflink between two ext4 volumes (named, with the option that
    makes a volume clone), and a copy for a run whose optimizer state is not on NVMe."""
    ck = copies["ck"] / "refused"
    for preset, copy, want, hint in (
        ("tiny_opt_nvme", "reflink", f"cannot be cloned from {copies['off']} (ext4) into "
         f"{copies['ck']} (ext4): ", "mkfs.xfs -m reflink=1"),
        ("tiny_opt_ram", "aio", "--checkpoint-copy aio copies the swap files of an optimizer "
         "on NVMe, and this run keeps its optimizer state in host memory", "drop --checkpoint"),
    ):  # fmt: skip
        p = iotune("run", preset, "--nvme-path", str(copies["off"]), "--steps", "1",
                   "--checkpoint-every", "1",
                   "--checkpoint-dir", str(ck), "--checkpoint-copy", copy, check=False)  # fmt: skip
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 2 and "Traceback" not in p.stderr, p.stderr
        assert want in lines[0] and hint in lines[1], p.stderr
        assert not ck.exists()
    assert not [f for f in copies["off"].iterdir() if f.name.startswith(".iotune-clone-")]


def _kill_marked(marker: str) -> int:
    """SIGKILL at once every process whose environment holds *marker*: the iotune command,
    and its worker wherever it was started (a zygote's child is not in its process group)."""
    killed = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in env:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(d.name), signal.SIGKILL)
                killed += 1
    return killed


def test_a_save_killed_in_its_copy_leaves_latest_on_the_save_before_and_it_resumes(
    tmp_path: Path,
) -> None:
    """The crash between two saves: every process of a run killed (SIGKILL) while its second
    save's aio copy is half written. ``latest`` still names the first save (iotune writes it
    only once a save is durable, and atomically), and a run resumed from the checkpoint
    folder loads that save and continues its loss. The checkpoint volume's writes are
    throttled (the kernel's blkio throttle) once the first save is in, so that the kill
    lands inside the second copy, which is checked."""
    devs = LoopDevices(tmp_path)
    rule = Path("/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device")
    majmin = ""
    try:
        _, off = _mounted(devs, 1024, "ext4")
        ck_dev, ck = _mounted(devs, 1536, "ext4")
        majmin = Path(f"/sys/block/{ck_dev}/dev").read_text().strip()
        folder = ck / "ck"
        marker = f"IOTUNE_CRASH_TEST={uuid.uuid4().hex}"
        key, _, value = marker.partition("=")
        run = subprocess.Popen(
            [IOTUNE, "--json", "run", "tiny_opt_nvme", "--nvme-path", str(off), "--steps", "2",
             "--checkpoint-every", "1", "--checkpoint-dir", str(folder),
             "--checkpoint-copy", "aio", "--out", str(tmp_path / "killed")],
            env={**os.environ, key: value}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            latest = folder / "latest"
            _wait(latest.exists, run)
            assert latest.read_text() == "step1"
            rule.write_text(f"{majmin} {16 * MIB}")  # 16 MiB/s: the copy now takes seconds
            copying = folder / "step2" / "offloaded_tensors" / "rank00"
            _wait(lambda: _du(copying) > 0 if copying.is_dir() else False, run)
            assert _kill_marked(marker) >= 2  # iotune and its worker
            run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                _kill_marked(marker)
                run.communicate(timeout=120)
        rule.write_text(f"{majmin} 0")
        majmin = ""
        first = _du(folder / "step1" / "offloaded_tensors")
        assert 0 < _du(copying) < first  # killed within the copy
        assert latest.read_text() == "step1"
        assert not list(folder.glob(".latest*"))
        # the killed run's swap files are left where it swapped (nothing of it could clean
        # up): the resumed run swaps on a volume of its own
        _, again = _mounted(devs, 1024, "ext4")
        doc = json.loads(
            iotune("--json", "run", "tiny_opt_nvme", "--nvme-path", str(again),
                   "--steps", "1", "--resume-from", str(folder), "--checkpoint-copy", "aio",
                   "--out", str(tmp_path / "resumed")).stdout
        )  # fmt: skip
        assert doc["resumed_at"] == 1
        assert doc["resume_check"]["ok"] is True, doc["resume_check"]
        init = next(e for e in doc["events"] if e["event"] == "init")
        (rec,) = init["resume_copy"]
        assert rec["source"].endswith("step1/offloaded_tensors/rank00") and rec["bytes"] == first
    finally:
        if majmin:
            rule.write_text(f"{majmin} 0")
        devs.close()


def _wait(done: Callable[[], bool], run: subprocess.Popen[str]) -> None:
    """Until *done*; a hang detector only (10 minutes), and the run's own end is a failure."""
    deadline = time.monotonic() + 600
    while not done():
        if run.poll() is not None:
            _, err = run.communicate()
            raise AssertionError(f"the run ended ({run.returncode}) first:\n{err[-3000:]}")
        assert time.monotonic() < deadline, "the run did not get there in 10 minutes"
        time.sleep(0.02)
