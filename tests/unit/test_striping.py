"""The stripe's share of a RAID0's rate that DeepSpeed's swap files get: DeepSpeed's async
I/O finishes one file before it starts the next, and md RAID0 sends chunk i of a file to
member i mod K, so each file takes as long as its busiest member. The closed form
(iotune.plan.drives) against a count chunk by chunk (tests/striping.py) and by hand; the
files one rank moves in a step (iotune.model.swapfiles.swap_files) by hand; and the
planner planning back to the array a swap rehearsal measured. Pure logic."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iotune.model.dsconfig import ds_config
from iotune.model.estimate import estimate
from iotune.model.presets import preset_with
from iotune.model.swapfiles import swap_files
from iotune.plan.datasheet import DriveSpec
from iotune.plan.drives import DriveInputs, Raid, busiest_member, plan_drives, stripe_share
from iotune.plan.measured import AdamRate, Bandwidth, Baseline
from iotune.plan.planner import plan_storage
from iotune.probes.host import RecordedHost
from tests.striping import share_by_count
from tests.vm.study_lab import SETS

KIB = 1024
CHUNK = 512 * KIB
#: the vm tier's study model: one layer of 256
LAB = preset_with("tiny_opt_nvme", SETS)
AIO = {"block_size": CHUNK, "queue_depth": 8, "intra_op_parallelism": 1}
#: its one sub-group: 1,835,776 fp32 elements, 7,343,104 bytes a state file (14 chunks and
#: 3 KiB); its one swapped gradient, 1,048,576 elements, 4 MiB (8 chunks)
STATE, GRAD = 7_343_104, 4 * 2**20


def test_a_file_of_14_chunks_and_a_bit_keeps_its_busiest_member_4_chunks_on_4() -> None:
    # chunks 0..13 go to members 0,1,2,3,0,..: 4,4,3,3; the 3 KiB after them to member 2
    assert busiest_member(STATE, CHUNK, 4) == 4 * CHUNK
    assert busiest_member(GRAD, CHUNK, 4) == 2 * CHUNK  # 8 chunks, 2 each
    assert busiest_member(16 * CHUNK + 3 * KIB, CHUNK, 4) == 4 * CHUNK + 3 * KIB
    assert busiest_member(100 * KIB, CHUNK, 4) == 100 * KIB  # under a chunk: one member
    assert busiest_member(STATE, CHUNK, 1) == STATE
    assert busiest_member(0, CHUNK, 4) == 0


def test_the_labs_files_get_89_percent_of_4_drives() -> None:
    reads, writes = swap_files(LAB, ds_config(LAB, aio=AIO))
    assert reads == writes == [STATE, STATE, STATE, GRAD]
    # 26,223,616 bytes against 4 x (3 x 4 + 2) chunks of the busiest members
    want = (3 * STATE + GRAD) / (4 * 14 * CHUNK)
    assert stripe_share(reads, CHUNK, 4) == pytest.approx(want, rel=1e-12)
    assert round(want, 4) == 0.8932
    # on 2: 7 chunks and the 3 KiB on one member a state file, 4 chunks a gradient
    two = 2 * (3 * (7 * CHUNK + 3 * KIB) + 4 * CHUNK)
    assert stripe_share(reads, CHUNK, 2) == pytest.approx((3 * STATE + GRAD) / two, rel=1e-12)
    assert stripe_share(reads, CHUNK, 1) == 1.0
    assert stripe_share([], CHUNK, 4) == stripe_share([0, 0], CHUNK, 4) == 1.0
    assert stripe_share([STATE], CHUNK, 1) == 1.0


def test_parameters_on_the_drive_are_read_twice_and_written_once() -> None:
    p = preset_with("tiny_params_opt_nvme", SETS)
    cfg = ds_config(p, aio=AIO)
    reads, writes = swap_files(p, cfg)
    opt_r, opt_w = swap_files(p, cfg, parameters=False)
    assert opt_r == opt_w == [STATE, STATE, STATE, GRAD]
    # the one bf16 partition of at least the aio minimum (1 MiB): the embedding, 4096 x 256
    # (2 MiB), tied to the lm head; the layer's largest, 256 x 768, is 384 KiB: no file
    assert reads[4:] == [2 * 2**20] * 2 and writes[4:] == [2 * 2**20]


def test_a_persistent_parameter_on_the_drive_is_read_once_a_step() -> None:
    """With the persistence threshold above the embedding's 1,048,576 elements, it is
    gathered once a step and kept (swapfiles.parameter_placement: PERSISTENT)."""
    p = preset_with("tiny_params_opt_nvme", SETS)
    cfg = ds_config(p, aio=AIO)
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 2_000_000
    reads, writes = swap_files(p, cfg)
    assert reads[4:] == writes[4:] == [2 * 2**20]


def test_reads_and_writes_each_get_the_share_of_their_own_files() -> None:
    """A run that reads the state files and writes only the gradient (made up, to tell the
    two lists apart): each direction at the share of its own files."""
    state, grad = (STATE,) * 3, (GRAD,)
    raid = Raid(CHUNK, CHUNK, 8, 1, "t", 1, state, grad)
    assert raid.share("read", 4) == pytest.approx(STATE / (4 * 4 * CHUNK))
    assert raid.share("write", 4) == 1.0  # 8 chunks, 2 on each of 4
    one = Bandwidth(1e6, 1e6, {}, {}, "one")
    est = estimate(LAB, ds_config(LAB, aio=AIO))
    (plan,) = plan_drives(LAB, est, DriveInputs(one, raid=raid), None, None, [4])
    assert plan.read_bw == pytest.approx(4e6 * STATE / (16 * CHUNK))
    assert plan.write_bw == pytest.approx(4e6)
    # with CPU Adam and forward + backward, the seconds it waits on the drives, in ms
    adam, base = AdamRate(1e-9, 2, 10**9, "threads"), Baseline(4.0, None, "ram", backward_s=3.0)
    (timed,) = plan_drives(LAB, est, DriveInputs(one, raid=raid), adam, base, [4])
    assert timed.io_s is not None and timed.io_s != round(timed.io_s, 4)
    assert timed.to_json()["io_s"] == round(timed.io_s, 3)
    # a drive whose SLC cache is past at every count: its sustained rate, at the share
    spec = DriveSpec("t", "t", 1e6, 1e6, capacity=1e12, cache=1.0, after_cache=0.5e6)
    swapped = DriveInputs(one, spec=spec, raid=replace(raid, write_files=state))
    (plan,) = plan_drives(LAB, est, swapped, None, None, [4])
    assert plan.write_bound == "SLC cache"
    w = est.steady_step.write / 4
    per = w / spec.write_seconds(w, 1e6)
    assert plan.write_bw == pytest.approx(4 * per * STATE / (16 * CHUNK))


@settings(max_examples=300, deadline=None)
@given(
    files=st.lists(st.integers(0, 40 * CHUNK), max_size=8),
    chunk=st.sampled_from([4 * KIB, 64 * KIB, 512 * KIB, 1 << 20]),
    k=st.integers(1, 17),
)
def test_the_closed_form_is_the_count_chunk_by_chunk(files: list[int], chunk: int, k: int) -> None:
    got = stripe_share(files, chunk, k)
    assert got == pytest.approx(share_by_count(files, chunk, k), rel=1e-12)
    assert 0 < got <= 1
    # whole stripes spread evenly: nothing lost
    assert stripe_share([f // (k * chunk) * k * chunk + k * chunk for f in files], chunk, k) == (
        pytest.approx(1.0) if files else 1.0
    )


def test_several_streams_fill_each_others_idle_members() -> None:
    files = (STATE,) * 3 + (GRAD,)
    one = Raid(CHUNK, CHUNK, 8, 1, "t", 1, files, files)
    assert one.share("read", 4) == pytest.approx(0.8932, abs=1e-4)
    for threads, ranks in ((2, 1), (1, 2)):
        more = Raid(CHUNK, CHUNK, 8, threads, "t", ranks, files, files)
        assert more.streams == threads * ranks
        assert more.share("read", 4) == more.share("write", 4) == 1.0


def _array(tmp_path: Path, chunk: int) -> tuple[str, RecordedHost]:
    """A sweep of a folder on md0, a RAID0 of four NVMe drives of *chunk* (sysfs built here)."""
    root, target = tmp_path / "root", tmp_path / "offload"
    target.mkdir()
    members = [f"nvme{i}n1" for i in range(4)]
    for i, m in enumerate(members):
        (root / "sys" / "block" / m).mkdir(parents=True)
        (root / "sys" / "block" / m / "dev").write_text(f"259:{i}\n")
    md = root / "sys" / "block" / "md0"
    (md / "md").mkdir(parents=True)
    (md / "dev").write_text("9:0\n")
    (md / "md" / "chunk_size").write_text(f"{chunk}\n")
    for m in members:
        (md / "slaves" / m).mkdir(parents=True)
    st_ = os.stat(target)
    link = root / "sys" / "dev" / "block" / f"{os.major(st_.st_dev)}:{os.minor(st_.st_dev)}"
    link.parent.mkdir(parents=True)
    link.symlink_to(os.path.relpath(md, link.parent))
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "points.jsonl").write_text("")
    (sweep / "sweep.json").write_text(json.dumps({"spec": {"target": str(target)}}))
    return str(sweep), RecordedHost(root)


#: what the plan's note says of each count, by preset: parameters on the drive add two reads
#: and a write of a 4-chunk file a step (on four: 90.7% of the reads, 90.0% of the writes)
NOTES = {
    "tiny_opt_nvme": "100.0% of 2 drives' rate, 89.3% of 4 drives' rate",
    "tiny_params_opt_nvme": "100.0% of 2 drives' rate, 90.7% read, 90.0% write of 4 drives' rate",
}


@pytest.mark.parametrize("name", sorted(NOTES))
@pytest.mark.parametrize("chunk", [CHUNK, 64 * KIB])
def test_a_rehearsal_on_an_array_plans_back_to_what_it_measured(
    tmp_path: Path, chunk: int, name: str
) -> None:
    """A swap rehearsal of 8 MB/s read, 6 MB/s write on four drives: one drive is a quarter
    of it over the share the optimizer's files (all a rehearsal swaps) had on the array's
    own chunk, and each count plans the run's own files (the parameters' too) on mdadm's
    default chunk."""
    sweep, host = _array(tmp_path, chunk)
    preset = preset_with(name, SETS)
    cfg = ds_config(preset, aio=AIO)
    bw = Bandwidth(8e6, 6e6, {}, {"read": 1, "write": 1}, "R", pattern="swap")
    args = dict.fromkeys(
        ("adam", "base", "baseline", "drive", "target", "link", "memory_bw", "chunk")
    )
    est = estimate(preset, cfg)
    plan = plan_storage(
        preset, est, cfg, bw=bw, aio_config=sweep, drives="1,2,4", host=host, **args
    )
    optimizer = [STATE, STATE, STATE, GRAD]
    share = share_by_count(optimizer, chunk, 4)
    one, two, four = plan["plans"]
    assert one["read_bw_bytes_s"] == round(8e6 / (4 * share))
    assert one["write_bw_bytes_s"] == round(6e6 / (4 * share))
    reads, writes = swap_files(preset, cfg)
    for k, row in ((2, two), (4, four)):
        r, w = share_by_count(reads, CHUNK, k), share_by_count(writes, CHUNK, k)
        assert row["read_bw_bytes_s"] == pytest.approx(k * 8e6 / (4 * share) * r, abs=1)
        assert row["write_bw_bytes_s"] == pytest.approx(k * 6e6 / (4 * share) * w, abs=1)
    if name == "tiny_opt_nvme" and chunk == CHUNK:  # the rehearsal given back
        assert (four["read_bw_bytes_s"], four["write_bw_bytes_s"]) == (8e6, 6e6)
    assert (
        "RAID0 against the swap files: DeepSpeed's async I/O moves one file at a time and a "
        f"file is done when its busiest member is, so this run's files get {NOTES[name]} "
        "(chunk 512 KiB)"
    ) in plan["notes"]
    if chunk == 64 * KIB:  # 112 chunks and 3 KiB a state file, 64 chunks a gradient
        busiest = 3 * (28 * chunk + 3 * KIB) + 16 * chunk
        assert share == pytest.approx((3 * STATE + GRAD) / (4 * busiest), rel=1e-12)
