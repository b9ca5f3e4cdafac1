"""The swap folder's copy in a checkpoint (iotune/workers/swapcopy.py): which of DeepSpeed's
copies it takes, what it copies, and its refusals; the async I/O op's copy itself is the
root tier's (tests/root/test_swapcopy_root.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import types
from pathlib import Path

import pytest

from iotune.workers.durable import durable_save, preallocate, write_latest
from iotune.workers.swapcopy import AioSettings, CopyError, copy_tree, is_swap_copy, swap_copies


def _swap_folder(root: Path) -> dict[str, str]:
    """A swap folder as DeepSpeed's optimizer swapper leaves it, with a gradient file that
    the save skips; its files' digests by relative path."""
    sizes = {"optimizer/0.tensor.swp": 3 * 4096, "optimizer/1.tensor.swp": 5000, "x.swp": 0}
    out = {}
    for rel, size in sizes.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        f.write_bytes(data)
        out[rel] = hashlib.sha256(data).hexdigest()
    (root / "gradient").mkdir()
    (root / "gradient" / "g.swp").write_bytes(b"g" * 10)
    return out


def _digests(root: Path) -> dict[str, str]:
    return {
        str(f.relative_to(root)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in root.rglob("*")
        if f.is_file()
    }


def test_only_the_copies_into_or_out_of_a_checkpoints_rank_folder_are_the_swap_copies() -> None:
    assert is_swap_copy("/nvme/zero_stage_3/optimizer", "/ck/step1/offloaded_tensors/rank00")
    assert is_swap_copy("/ck/step1/offloaded_tensors/rank01", "/nvme/swap")
    assert not is_swap_copy("/a/b", "/c/d")
    assert not is_swap_copy("/ck/offloaded_tensors", "/x")


def test_within_swap_copies_deepspeeds_copy_of_the_swap_folder_is_recorded_and_exact(
    tmp_path: Path,
) -> None:
    """The copy DeepSpeed's save makes (shutil.copytree with its ignore of the gradients)
    goes through iotune's, the copy is byte for byte the swap files, and the record counts
    them; another copytree in the same block, and any after it, is shutil's own."""
    src = tmp_path / "swap"
    want = _swap_folder(src)
    dst = tmp_path / "ck" / "step1" / "offloaded_tensors" / "rank00"
    dst.parent.mkdir(parents=True)
    with swap_copies("deepspeed") as records:
        # as DeepSpeed's engine calls it (runtime/engine.py), the name looked up at the call
        from shutil import copytree

        copytree(src, dst, ignore=lambda _, names: [n for n in names if "gradient" in n])
        copytree(src, tmp_path / "other")  # not a swap copy: shutil's, the gradients too
    assert _digests(dst) == want
    assert "gradient/g.swp" in _digests(tmp_path / "other")
    (rec,) = records
    assert rec.copy == "deepspeed" and rec.files == 3
    assert rec.bytes == sum(f.stat().st_size for f in dst.rglob("*") if f.is_file())
    assert rec.durable_s <= rec.seconds
    assert shutil.copytree.__module__ == "shutil"


def test_a_load_copies_back_over_the_swap_files(tmp_path: Path) -> None:
    """load_checkpoint copies the checkpoint's files over the run's swap folder
    (dirs_exist_ok): each file is the checkpoint's after it, a longer old one cut short."""
    ck = tmp_path / "ck" / "step1" / "offloaded_tensors" / "rank00"
    want = _swap_folder(ck)
    shutil.rmtree(ck / "gradient")
    swap = tmp_path / "swap"
    (swap / "optimizer").mkdir(parents=True)
    (swap / "optimizer" / "1.tensor.swp").write_bytes(b"old" * 9000)
    with swap_copies("deepspeed") as records:
        shutil.copytree(ck, swap, dirs_exist_ok=True)
    assert _digests(swap) == want and len(records) == 1


def test_a_file_system_that_cannot_clone_is_one_line(tmp_path: Path) -> None:
    """reflink where the file system does not clone (this tier's temporary folder: ext4 or
    tmpfs) is refused in one line naming the folder and what would clone."""
    src = tmp_path / "swap"
    _swap_folder(src)
    with pytest.raises(CopyError) as e:
        copy_tree(src, tmp_path / "ck" / "offloaded_tensors" / "rank00", "reflink")
    assert "file system does not clone files (XFS with reflink, btrfs do)" in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_copies_and_settings_are_one_line(tmp_path: Path) -> None:
    unknown = "unknown copy 'rsync': one of aio, reflink, deepspeed"
    with pytest.raises(CopyError, match=unknown), swap_copies("rsync"):
        pass
    with pytest.raises(CopyError, match=r"not a multiple of 16384 \(4096 bytes x 4 threads\)"):
        AioSettings(chunk=10_000).checked()
    dst = tmp_path / "d"
    dst.mkdir()
    with pytest.raises(FileExistsError):
        copy_tree(tmp_path, dst, "reflink")


@pytest.mark.parametrize(
    ("aio", "threads"),
    [
        ({"block_size": 524288, "queue_depth": 8, "intra_op_parallelism": 3}, 3),
        ({"block_size": 1048576, "thread_count": 2}, 2),  # DeepSpeed's old name for it
        (None, 1),
    ],
)
def test_the_copys_settings_are_the_runs_aio_section(
    aio: dict[str, int] | None, threads: int
) -> None:
    """The run's aio section (a sweep's best where given): its block, depth and threads; the
    chunk the largest whole number of O_DIRECT units for the threads up to 64 MiB."""
    from iotune.workers.swapcopy import ALIGN, settings_of

    s = settings_of(aio).checked()
    assert s.intra_op_parallelism == threads
    assert s.block_size == (aio or {}).get("block_size", 1 << 20)
    unit = ALIGN * threads
    assert s.chunk % unit == 0 and (64 << 20) - unit < s.chunk <= 64 << 20


def test_deepspeeds_own_copy_is_left_in_its_way(tmp_path: Path) -> None:
    """--checkpoint-copy deepspeed (the default): DeepSpeed's shutil.copytree untouched, no
    record, as without iotune."""
    from iotune.workers.swapcopy import copies

    for copy in (None, "deepspeed"):
        with copies(copy, None) as made:
            assert shutil.copytree.__module__ == "shutil"
        assert made == []
    with copies("aio", {"intra_op_parallelism": 2}) as made:
        assert shutil.copytree.__module__ != "shutil"
    assert shutil.copytree.__module__ == "shutil"


class _Engine:
    """What durable_save reads of a DeepSpeed engine, and a save that writes a tag folder and
    records, as DeepSpeed's does, whether it would write ``latest`` itself."""

    def __init__(self, rank: int = 0, decoupled: bool = False) -> None:
        self.global_steps = 7
        self.global_rank = rank
        self.asked: list[dict[str, object]] = []
        self.checkpoint_engine = type("CE", (), {"is_decoupled": lambda _self: decoupled})()

    def save_checkpoint(
        self,
        save_dir: str,
        tag: str | None = None,
        client_state: dict[str, object] | None = None,
        save_latest: bool = True,
    ) -> bool:
        self.asked.append({"tag": tag, "save_latest": save_latest, "state": client_state})
        folder = Path(save_dir) / str(tag)
        (folder / "offloaded_tensors" / "rank00").mkdir(parents=True)
        (folder / "mp_rank_00_model_states.pt").write_bytes(b"m" * 100)
        (folder / "offloaded_tensors" / "rank00" / "0.tensor.swp").write_bytes(b"s" * 4096)
        if save_latest:
            (Path(save_dir) / "latest").write_text(str(tag))
        return True


def test_latest_is_written_by_iotune_after_the_tag_folder_and_atomically(
    tmp_path: Path,
) -> None:
    eng = _Engine()
    (tmp_path / "latest").write_text("global_step6")
    out, held = durable_save(eng, tmp_path)
    assert out is True
    # DeepSpeed's default tag, and DeepSpeed told not to write latest itself
    assert eng.asked == [{"tag": "global_step7", "save_latest": False, "state": {}}]
    assert held == {"files": 2, "bytes": 4196, "swap_copy_bytes": 4096}
    assert (tmp_path / "latest").read_text() == "global_step7"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step7", "latest"]


def test_only_rank_0_writes_latest_and_a_save_without_it_writes_none(tmp_path: Path) -> None:
    durable_save(_Engine(rank=1), tmp_path / "a", tag="t1")
    assert not (tmp_path / "a" / "latest").exists()
    durable_save(_Engine(), tmp_path / "b", tag="t2", save_latest=False)
    assert not (tmp_path / "b" / "latest").exists()
    write_latest(tmp_path / "b", "t2")
    write_latest(tmp_path / "b", "t3")
    assert (tmp_path / "b" / "latest").read_text() == "t3"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["latest", "t2"]


def test_the_decoupled_writers_save_is_left_to_deepspeeds_order(tmp_path: Path) -> None:
    eng = _Engine(decoupled=True)
    _, held = durable_save(eng, tmp_path, tag=3)
    assert eng.asked == [{"tag": "3", "save_latest": True, "state": {}}] and held == {}


def test_a_scripts_save_within_swap_copies_keeps_that_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = types.ModuleType("deepspeed.runtime.engine")
    engine.DeepSpeedEngine = _Engine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deepspeed.runtime.engine", engine)
    real = _Engine.save_checkpoint
    eng = _Engine()
    with swap_copies("aio"):
        # as a script may call it: the tag, the client state and save_latest by position
        assert eng.save_checkpoint(str(tmp_path), "t", {"k": 1}, True) is True
    assert eng.asked == [{"tag": "t", "save_latest": False, "state": {"k": 1}}]
    assert (tmp_path / "latest").read_text() == "t"
    assert _Engine.save_checkpoint is real
    with swap_copies("aio", order_saves=False):
        eng.save_checkpoint(str(tmp_path / "x"), "u")
    assert eng.asked[-1]["save_latest"] is True


def test_preallocate_gives_the_file_its_size_and_its_blocks(tmp_path: Path) -> None:
    """The copy's target laid out before O_DIRECT fills it: its length the source's, and,
    where the file system allocates ahead (ext4, XFS, btrfs, tmpfs), every block in place;
    nothing written, so it reads back as zeros."""
    path = tmp_path / "t"
    with open(path, "wb") as fh:
        allocated = preallocate(fh.fileno(), 3 * 4096 + 1)
        assert preallocate(fh.fileno(), 0)  # nothing to lay out
    st = path.stat()
    assert st.st_size == 3 * 4096 + 1
    assert not allocated or st.st_blocks * 512 >= 4 * 4096
    assert path.read_bytes() == b"\0" * (3 * 4096 + 1)
