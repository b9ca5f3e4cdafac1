"""Root tier: a run's checkpoints (`--checkpoint-every/--checkpoint-dir`, `--resume-from`) on a
volume of their own. Real DeepSpeed ZeRO-3 saves, on CPU, from an offload volume (ext4 on a loop
device) to a checkpoint volume (another), traced by the real eBPF program: each save's copy of
the optimizer state is the I/O model's to the byte, the drives' counts agree with the kernel's,
and a run resumed from a save trains on as the run that saved it did."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.root.conftest import LoopDevices, iotune
from tests.root.fswrites import traced_run

pytestmark = pytest.mark.beside_study

KIB, MIB = 1 << 10, 1 << 20


def _volume(devs: Callable[..., str], size_mib: int) -> tuple[str, Path]:
    dev = devs(size_mib=size_mib, fs="ext4", mount=True)
    Path(f"/sys/block/{Path(dev).name}/queue/max_sectors_kb").write_text("512")
    return Path(dev).name, devs.mounts[-1]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def volumes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    devs = LoopDevices(tmp_path_factory.mktemp("ckpt"))
    try:
        off_dev, off = _volume(devs, 2048)
        ck_dev, ck = _volume(devs, 2048)  # three runs' saves: 4 of 0.32 GiB
        _small_dev, small = _volume(devs, 256)
        yield {
            "tmp": devs.tmp,
            "offload": off,
            "offload_dev": off_dev,
            "ck": ck,
            "ck_dev": ck_dev,
            "small": small,
        }
    finally:
        devs.close()


def _run(v: dict[str, Any], name: str, *args: str) -> dict[str, Any]:
    """The run's document, with ext4's own writes on the offload volume (``fs_own_writes``)."""
    return traced_run(v["tmp"] / name, v["offload"], *args)


@pytest.fixture(scope="module")
def saved(volumes: dict[str, Any]) -> dict[str, Any]:
    """Two steps, a save after each; then one step resumed from the first save."""
    first = _run(
        volumes,
        "saving",
        *("--steps", "2", "--checkpoint-every", "1"),
        *("--checkpoint-dir", str(volumes["ck"] / "ck")),
    )
    resumed = _run(
        volumes, "resumed", "--steps", "1", "--resume-from", str(volumes["ck"] / "ck" / "step1")
    )
    return {"first": first, "resumed": resumed, **volumes}


def test_each_save_copies_the_optimizer_state_to_the_byte(saved: dict[str, Any]) -> None:
    doc = saved["first"]
    ck = doc["checkpoints"]
    n_s = doc["estimate"]["swapped"]["n_s"]
    assert ck["writer"] == "torch"
    assert ck["offload_drives"] == [saved["offload_dev"]]
    assert ck["checkpoint_drives"] == [saved["ck_dev"]]
    assert ck["estimate"] == {
        "bytes": 12 * n_s,
        "read_bytes": 12 * n_s,
        "write_bytes": 12 * n_s,
        "exact": True,
    }
    assert [s["tag"] for s in ck["saves"]] == ["step1", "step2"]
    for s in ck["saves"]:
        # fp32 master and Adam's two moments, 4 bytes a swapped parameter each
        assert s["swap_copy_bytes"] == 12 * n_s
        # the two .pt files beside the copy: small pickles with the state on NVMe
        assert 12 * n_s < s["bytes"] < 12 * n_s + 1 * MIB
        assert 0 < s["blocked_s"] <= s["durable_s"]
        # read from the offload volume: the three swap files, and the folder's metadata
        assert 12 * n_s <= s["offload_read_bytes"] <= 12 * n_s + 64 * KIB, s
        # written to the checkpoint volume: what the save left there, and ext4's journal
        assert s["bytes"] <= s["checkpoint_write_bytes"] <= s["bytes"] + 4 * MIB, s
        # the same by exact request size, as traced
        read = sum(int(k) * n for k, n in s["offload_read_sizes"].items())
        wrote = sum(int(k) * n for k, n in s["checkpoint_write_sizes"].items())
        assert 12 * n_s <= read <= 12 * n_s + 64 * KIB, s["offload_read_sizes"]
        assert s["bytes"] <= wrote <= s["bytes"] + 4 * MIB, s["checkpoint_write_sizes"]
    # beside the tags, DeepSpeed's scripts that turn a save into one fp32 state dict
    # and iotune's ledger of the saving run's losses, for the resumed runs' check
    tags = {p.name for p in (saved["ck"] / "ck").iterdir() if p.suffix != ".py"}
    assert tags == {"latest", "step1", "step2", "iotune-losses.json"}
    ledger = json.loads((saved["ck"] / "ck" / "iotune-losses.json").read_text())["losses"]
    assert list(ledger) == ["1", "2"]
    assert (saved["ck"] / "ck" / "latest").read_text().strip() == "step2"


def test_the_traced_counts_agree_with_the_kernel_on_both_volumes(saved: dict[str, Any]) -> None:
    checks = {c["device"]: c for c in saved["first"]["diskstats_check"]}
    assert set(checks) == {saved["offload_dev"], saved["ck_dev"]}
    for c in checks.values():
        # exact, or short only by completions the kernel counted that fired no event (its
        # own loss on a loop device under load, 6.18: the issues add up, each request sized)
        # the whole check in the message (a dict's repr is cut short): one run here counted
        # one write completion more than the kernel (2206/2205) and passed again at once
        assert c["exact"] or (c["unseen_completions"] and c["summary"].startswith("consistent")), (
            json.dumps(c, sort_keys=True)
        )


def test_saves_leave_the_steps_io_as_modelled(saved: dict[str, Any]) -> None:
    doc = saved["first"]
    steady = next(r for r in doc["table"] if r["case"].startswith("steady step"))
    est = next(r for r in doc["estimate_table"] if r["case"] == "estimate: steady step")
    # the save read the swap files through the page cache; the step's reads are O_DIRECT
    assert steady["read_bytes"] == est["read_bytes"]
    # beyond the model's data, ext4's own writes: its journal commits every 5 s, so a slower
    # step holds more of them (the kernel's count over the whole run bounds them)
    own = doc["fs_own_writes"]
    assert (
        est["write_bytes"] <= steady["write_bytes"] <= est["write_bytes"] + 256 * KIB + own["bytes"]
    ), (steady, est, own)
    labels = [s["label"] for s in doc["io_steps"]]
    assert labels.index("step:1") < labels.index("checkpoint:1") < labels.index("step:2")


def test_a_resumed_run_trains_on_from_the_save(saved: dict[str, Any]) -> None:
    first, resumed = saved["first"], saved["resumed"]
    assert resumed["resumed_at"] == 1
    # its initialisation moved more than a fresh start's: the estimate is a resume's (the
    # save's swap files copied back by DeepSpeed's copytree from the checkpoint volume, 12N
    # written; the master reloaded, 4N each way; Adam's moments read back at the first step,
    # a steady step's I/O), and the run says so; the saving run's is a fresh start's
    n_s, n_g = (resumed["estimate"]["swapped"][k] for k in ("n_s", "n_g"))
    want = (20 * n_s + 4 * n_g, 36 * n_s + 4 * n_g)
    est = next(r for r in resumed["estimate_table"] if r["case"] == "estimate: init + first step")
    assert (est["read_bytes"], est["write_bytes"]) == want, (est, want)
    got = next(r for r in resumed["table"] if r["case"] == "init + first step")
    assert want[0] <= got["read_bytes"] <= want[0] + 64 * KIB, (got, want)
    own = resumed["fs_own_writes"]  # ext4's journal and metadata, as for a steady step
    assert -256 * KIB <= got["write_bytes"] - want[1] <= 256 * KIB + own["bytes"], (got, want, own)
    moved = [n for n in resumed["notes"] if n.startswith("resumed: the estimate's initialisation")]
    assert len(moved) == 1 and "swap files copied back" in moved[0], resumed["notes"]
    assert not any(n.startswith("resumed: the estimate") for n in first["notes"]), first["notes"]
    step = next(e for e in resumed["events"] if e["event"] == "step")
    assert step["global_step"] == 2
    # the same state and the same batch as the saving run's second step: the same loss
    loss2 = next(e["loss"] for e in first["events"] if e["event"] == "step" and e["step"] == 2)
    assert math.isclose(step["loss"], loss2, rel_tol=1e-4), (step["loss"], loss2)
    assert resumed["checkpoints"] is None
    # iotune's own check: the saving run's loss at step 2, kept beside its tags
    check = resumed["resume_check"]
    assert check["ok"] is True and check["at_step"] == 2, check
    assert check["saved_run_loss"] == pytest.approx(loss2, abs=1e-5)
    assert any(n.startswith("resumed: step 2's loss") for n in resumed["notes"]), resumed["notes"]


def test_a_checkpoint_that_does_not_continue_the_loss_fails_the_run(
    saved: dict[str, Any],
) -> None:
    """A save whose optimizer state was lost (its swap files' copy zeroed, sizes kept): the
    run resumed from it trains one step, finds its loss is not the saving run's, and fails,
    saying so in one line."""
    src, broken = saved["ck"] / "ck", saved["tmp"] / "broken"
    shutil.copytree(src / "step1", broken / "step1")
    shutil.copy(src / "iotune-losses.json", broken)
    (broken / "latest").write_text("step1")
    for f in (broken / "step1").rglob("*.swp"):
        size = f.stat().st_size
        with f.open("r+b") as fh:
            fh.write(b"\0" * size)
    out = saved["tmp"] / "resumed-broken"
    p = iotune(
        "run", "tiny_opt_nvme", "--nvme-path", str(saved["offload"]), "--steps", "2",
        "--resume-from", str(broken), "--out", str(out), check=False,
    )  # fmt: skip
    assert p.returncode == 1, p.stderr[-3000:]
    lines = [x for x in p.stderr.splitlines() if x.startswith(("iotune: error", "hint:"))]
    assert lines[0].startswith(
        f"iotune: error: the run resumed from {broken / 'step1'} does not continue its loss: "
        "step 2 gave "
    ), p.stderr[-3000:]
    assert lines[1].startswith("hint: the checkpoint does not hold the state"), lines
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    # it stopped after that step: one step recorded, and the check with it
    recs = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in recs if r.get("event") == "step"] == [1]
    (check,) = [r for r in recs if r.get("event") == "resume_check"]
    assert check["ok"] is False and check["saved_run_loss"] is not None


def test_bad_checkpoint_options_are_one_line_refusals(saved: dict[str, Any]) -> None:
    v = saved
    cases = [
        (("--checkpoint-every", "1"), "--checkpoint-every needs its partner"),
        (
            ("--checkpoint-every", "1", "--checkpoint-dir", str(v["offload"] / "ck")),
            "is on the offload volume",
        ),
        (
            ("--checkpoint-every", "1", "--checkpoint-dir", str(v["small"] / "ck")),
            "3 save(s) of about 0.32 GiB need 0.97 GiB",
        ),
        (("--resume-from", str(v["small"])), "holds no DeepSpeed checkpoint"),
        (("--resume-from", str(v["tmp"] / "nowhere")), "is not a folder"),
        (
            ("--checkpoint-every", "1", "--checkpoint-dir", str(v["tmp"] / "ro" / "ck")),
            f"--checkpoint-dir {v['tmp'] / 'ro' / 'ck'} is not writable ({v['tmp'] / 'ro'})",
        ),
        # root may write to /proc as access(2) sees it, and it has 0 bytes free: neither is why
        (
            ("--checkpoint-every", "1", "--checkpoint-dir", "/proc"),
            "--checkpoint-dir /proc is on proc, the kernel's own file system",
        ),
    ]
    # a read-only file system: root may write anywhere else
    (v["tmp"] / "ro").mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(v["tmp"] / "ro")], check=True
    )
    try:
        _refused(v, cases)
    finally:
        subprocess.run(["umount", str(v["tmp"] / "ro")], check=True)


def _refused(v: dict[str, Any], cases: list[tuple[tuple[str, ...], str]]) -> None:
    for args, want in cases:
        p = iotune(
            "run",
            "tiny_opt_nvme",
            "--nvme-path",
            str(v["offload"]),
            "--steps",
            "3",
            *args,
            check=False,
        )
        assert p.returncode == 2, (args, p.stderr)
        lines = p.stderr.strip().splitlines()
        assert want in lines[0], (args, p.stderr)
        assert len(lines) <= 2 and "Traceback" not in p.stderr, p.stderr
    # nothing was written by a refused run
    for left in (v["offload"] / "ck", v["small"] / "ck"):
        assert not left.exists(), left


@pytest.fixture(scope="module")
def fastpersist(saved: dict[str, Any]) -> dict[str, Any]:
    """DeepSpeed's FastPersist writers on this host's CPU: one step saved by the ``fast``
    writer, then one step resumed from that save and saved by the ``decoupled`` writer
    (its own process)."""
    v = saved
    fast = _run(
        v,
        "fast",
        *("--steps", "1", "--checkpoint-every", "1", "--checkpoint-writer", "fast"),
        *("--checkpoint-dir", str(v["ck"] / "fast")),
    )
    decoupled = _run(
        v,
        "decoupled",
        *("--steps", "1", "--checkpoint-every", "1", "--checkpoint-writer", "decoupled"),
        *("--checkpoint-dir", str(v["ck"] / "decoupled")),
        *("--resume-from", str(v["ck"] / "fast" / "step1")),
    )
    return {"fast": fast, "decoupled": decoupled}


@pytest.mark.parametrize("writer", ["fast", "decoupled"])
def test_fastpersist_writers_save_the_same_bytes_on_a_cpu(
    saved: dict[str, Any], fastpersist: dict[str, Any], writer: str
) -> None:
    doc = fastpersist[writer]
    ck = doc["checkpoints"]
    n_s = doc["estimate"]["swapped"]["n_s"]
    assert ck["writer"] == writer
    assert any("its buffer page-locked by the aio op" in n for n in doc["notes"]), doc["notes"]
    forked = any("forked from the training worker" in n for n in doc["notes"])
    assert forked == (writer == "decoupled"), doc["notes"]
    torch_save = saved["first"]["checkpoints"]["saves"][0]
    (s,) = ck["saves"]
    # the swap files' copy as with torch.save; the .pt pickles beside it through the writer:
    # the same zip records, named "archive/..." where torch.save names them by file
    # ("mp_rank_00_model_states/...": 4,376 and 4,504 bytes fewer seen)
    assert s["swap_copy_bytes"] == 12 * n_s
    assert 0 < torch_save["bytes"] - s["bytes"] <= 8 * KIB, (s["bytes"], torch_save["bytes"])
    assert 0 < s["blocked_s"] <= s["durable_s"]
    assert s["bytes"] <= s["checkpoint_write_bytes"] <= s["bytes"] + 4 * MIB, s


def test_a_run_resumed_from_the_fast_writers_save_trains_on(
    saved: dict[str, Any], fastpersist: dict[str, Any]
) -> None:
    resumed = fastpersist["decoupled"]
    assert resumed["resumed_at"] == 1
    step = next(e for e in resumed["events"] if e["event"] == "step")
    loss2 = next(
        e["loss"] for e in saved["first"]["events"] if e["event"] == "step" and e["step"] == 2
    )
    assert math.isclose(step["loss"], loss2, rel_tol=1e-4), (step["loss"], loss2)
    # the fast run saved its only step: no later loss of it for iotune to check against
    assert resumed["resume_check"]["ok"] is None
    assert any("the resumed loss is not checked" in n for n in resumed["notes"])


def test_the_report_shows_each_writers_saves_beside_the_model(
    saved: dict[str, Any], fastpersist: dict[str, Any], tmp_path: Path
) -> None:
    """`iotune report` over the three runs that saved: a row each, with its writer, its
    saves' bytes beside the I/O model's and the checkpoint volume's drive."""
    from iotune.report.tables import num

    out = tmp_path / "report"
    runs = [str(saved["tmp"] / name) for name in ("saving", "fast", "decoupled")]
    iotune("report", *runs, "--out", str(out), "--format", "md")
    md = (out / "report.md").read_text()
    section = md.split("## Checkpoints", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in table[2:]]
    rows = [dict(zip(header, c, strict=True)) for c in cells]
    assert sorted(r["Writer"] for r in rows) == ["decoupled", "fast", "torch"], section
    by = {r["Writer"]: r for r in rows}
    assert by["torch"]["Saves"] == "2" and by["fast"]["Saves"] == by["decoupled"]["Saves"] == "1"
    gib = 12 * saved["first"]["estimate"]["swapped"]["n_s"] / 2**30
    for r in rows:
        assert r["Checkpoint volume"] == saved["ck_dev"], r
        # the swap files' copy: the I/O model's bytes read from the offload volume
        assert float(r["Read offload GiB"]) == pytest.approx(gib, abs=0.002), r
        assert r["GiB a save (model)"].endswith(f"({num(gib)})"), r


def _du_files(folder: Path) -> int:
    """The bytes of the files under *folder*: du -sb, less its folders' own sizes."""
    du = subprocess.run(["du", "-sb", str(folder)], check=True, capture_output=True, text=True)
    dirs = subprocess.run(
        ["find", str(folder), "-type", "d", "-printf", "%s\\n"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(du.stdout.split()[0]) - sum(int(x) for x in dirs.stdout.split())


def test_a_save_of_two_ranks_is_the_tag_folder_counted_once(tmp_path: Path) -> None:
    """Two ranks through DeepSpeed's launcher, one step and its save on a volume of its own.
    Each rank's save event counts the whole tag folder (DeepSpeed's save ends in a barrier):
    the run's save is that folder, once; and the run's drives are those it swapped to."""
    devs = LoopDevices(tmp_path)
    try:
        off_dev, off = _volume(devs, 1024)
        ck_dev, ck = _volume(devs, 1024)
        doc = json.loads(
            iotune(
                "--json", "run", "tiny_opt_nvme", "--ranks", "2", "--steps", "1",
                "--nvme-path", str(off), "--checkpoint-every", "1",
                "--checkpoint-dir", str(ck / "ck"), "--out", str(tmp_path / "run"),
            ).stdout
        )  # fmt: skip
        assert doc["ranks"] == 2 and doc["exit_code"] == 0
        assert doc["drives"] == [off_dev]
        saves = doc["checkpoints"]
        assert saves["offload_drives"] == [off_dev] and saves["checkpoint_drives"] == [ck_dev]
        (save,) = saves["saves"]
        tag = ck / "ck" / "step1"
        assert {p.name for p in (tag / "offloaded_tensors").iterdir()} == {"rank00", "rank01"}
        assert save["bytes"] == _du_files(tag), save
        assert save["files"] == sum(1 for f in tag.rglob("*") if f.is_file())
        # both ranks' copies of their swap files: the two-rank model's, to the byte
        n_s = doc["estimate"]["swapped"]["n_s"]
        assert save["swap_copy_bytes"] == 2 * 12 * n_s == saves["estimate"]["write_bytes"]
        # the checkpoint drive wrote the save once (and ext4's journal)
        assert save["bytes"] <= save["checkpoint_write_bytes"] <= save["bytes"] + 8 * MIB, save
    finally:
        devs.close()
