"""Several ranks and nodes: the launcher's command line, the hostfile, the per-rank I/O model
and preflight, and the merging of the ranks' step records, from pure logic."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from iotune.errors import UsageError
from iotune.model.dsconfig import ds_config
from iotune.model.estimate import estimate
from iotune.model.presets import preset_with
from iotune.model.swapfiles import rank_tensors
from iotune.proc import ZYGOTE_ENV, module_args
from iotune.train.launch import (
    Launch,
    launch_command,
    place,
    plan_launch,
    read_hostfile,
    world_info,
)
from iotune.train.preflight import Resources, preflight, swap_dir_users
from iotune.train.ranks import merge_ranks, per_rank
from iotune.train.results import per_drive
from iotune.workers.launch import LOCAL_LAUNCH, master_port

GIB = 2**30


def _est(name: str, ranks: int, nodes: int = 1) -> Any:
    p = preset_with(name, (f"ranks={ranks}", f"nodes={nodes}"))
    return estimate(p, ds_config(p))


def test_partitions_are_ceil_of_each_tensor_over_the_world() -> None:
    p = preset_with("tiny_opt_nvme", ("ranks=3",))
    full = [n for _, n in p.geometry.tensors()]
    assert rank_tensors(p) == [-(-n // 3) for n in full]
    assert rank_tensors(preset_with("tiny_opt_nvme", ())) == full


def test_state_is_partitioned_not_duplicated() -> None:
    """1B: every partition is far above the swap threshold, so two ranks of one node swap
    what one rank does, each half of it; the footprint and bytes per step are the same."""
    one, two = _est("opt_nvme_1b", 1), _est("opt_nvme_1b", 2)
    assert two.ranks == 2 and two.world == 2
    assert two.swapped.n_s * 2 == pytest.approx(one.swapped.n_s, abs=2 * 64)
    assert two.nvme_bytes == pytest.approx(one.nvme_bytes, rel=1e-6)
    assert two.steady_step.read == pytest.approx(one.steady_step.read, rel=1e-6)
    assert two.per_rank(two.steady_step).write * 2 == two.steady_step.write
    # two nodes of one rank each: this node holds half
    apart = _est("opt_nvme_1b", 1, nodes=2)
    assert apart.world == 2 and apart.ranks == 1
    assert apart.nvme_bytes == pytest.approx(one.nvme_bytes / 2, rel=1e-6)


def test_small_partitions_fall_under_the_swap_threshold() -> None:
    """tiny: q_proj and o_proj gradients (1 MiB each) halve to 0.5 MiB on two ranks and stay
    in RAM (DeepSpeed swaps tensors of at least 1 MiB): 4 layers x 2 x 1 MiB less."""
    one, two = _est("tiny_opt_nvme", 1), _est("tiny_opt_nvme", 2)
    assert two.swapped.n_s * 2 == one.swapped.n_s  # the fp32 state: partitioned
    assert one.nvme_bytes - two.nvme_bytes == 4 * 2 * 2**20
    assert one.steady_step.read - two.steady_step.read == 4 * 2 * 2**20


def test_host_ram_is_per_rank_times_ranks() -> None:
    one, eight = _est("opt_nvme_1b", 1), _est("opt_nvme_1b", 8)
    assert eight.host_bytes == 8 * eight.host.peak
    # each rank has its own process, CUDA context and pinned buffers: eight ranks of one
    # node need three times what one rank needs, though each holds an eighth of the state
    assert eight.host_bytes > 3 * one.host_bytes
    # parameter offload's swap buffers are sized by the config, not the partition
    p1, p8 = _est("params_opt_nvme_1b", 1), _est("params_opt_nvme_1b", 8)
    assert p8.host.param_buffers >= p1.host.param_buffers - 2 * p1.swapped.largest_subgroup
    assert eight.gpu_bytes is not None and one.gpu_bytes is not None
    assert eight.gpu_bytes <= one.gpu_bytes  # per device
    cpu = _est("tiny_opt_nvme", 2)
    assert cpu.host.collectives > 2 * (66 * 2**20)  # two ranks' shm workspaces at least
    assert _est("tiny_opt_nvme", 1).host.collectives == 0


def test_preflight_checks_each_volume_for_its_ranks() -> None:
    e = _est("opt_nvme_1b", 2)
    half = e.nvme_bytes // 2
    res = Resources(
        "H100",
        80 * GIB,
        10**13,
        None,
        volumes=(("/mnt/a", half + GIB, 1), ("/mnt/b", half // 2, 1)),
    )
    (short,) = preflight(e, res, "/mnt/a, /mnt/b")
    assert short.where == "at /mnt/b" and short.have == half // 2
    both = Resources("H100", 80 * GIB, 10**13, None, volumes=(("/mnt/a", half + GIB, 2),))
    assert [s.where for s in preflight(e, both, "/mnt/a")] == ["at /mnt/a"]


def test_hostfile_is_parsed_and_bad_lines_are_named(tmp_path: Path) -> None:
    hf = tmp_path / "hostfile"
    hf.write_text("# nodes\nnode-a slots=8\n\nnode-b slots=4  # second\n")
    assert read_hostfile(hf) == (("node-a", 8), ("node-b", 4))
    for text, words in (
        ("node-a 8\n", "is not 'HOST slots=N'"),
        ("node-a slots=x\n", "is not 'HOST slots=N'"),
        ("node-a slots=1\nnode-a slots=2\n", "listed twice"),
        ("# nothing\n", "names no host"),
    ):
        hf.write_text(text)
        with pytest.raises(UsageError) as exc:
            read_hostfile(hf)
        assert words in exc.value.message
    with pytest.raises(UsageError):
        read_hostfile(tmp_path / "missing")


def test_plan_launch_from_the_options(tmp_path: Path) -> None:
    assert plan_launch(None, None, None, None, None) is None
    assert plan_launch(1, None, None, None, None) is None
    assert plan_launch(4, None, None, None, None) == Launch(ranks=4)
    hf = tmp_path / "hostfile"
    hf.write_text("node-a slots=2\nnode-b slots=2\n")
    la = plan_launch(None, str(hf), 1, None, None)
    assert la is not None and (la.ranks, la.nodes, la.world, la.node) == (2, 2, 4, "node-b")
    assert la.master_addr == "node-a"
    for args, words in (
        ((2, None, 1, None, None), "--node-rank needs --hostfile"),
        ((None, str(hf), 2, None, None), "is not a node of"),
        ((3, str(hf), 0, None, None), "gives this node 2 slots"),
        ((None, str(hf), 0, None, "pdsh"), "exclude each other"),
        ((None, None, None, None, "slurm"), "--launcher needs --hostfile"),
    ):
        with pytest.raises(UsageError) as exc:
            plan_launch(*args)  # type: ignore[arg-type]
        assert words in exc.value.message


def test_launch_command_uses_deepspeeds_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ZYGOTE_ENV, raising=False)
    spec = tmp_path / "spec.json"
    cmd = launch_command(Launch(ranks=2), spec, "cpu", env={})
    assert cmd[:3] == [sys.executable, "-m", "iotune.workers.launch"]
    assert cmd[cmd.index("--num_gpus") + 1] == "2" and "--no_local_rank" in cmd
    assert cmd[-3:] == ["--module", "iotune.workers.train", str(spec)]
    # CUDA_VISIBLE_DEVICES narrows the GPUs: DeepSpeed's --include keeps them
    cuda = launch_command(Launch(ranks=2), spec, "cuda", env={"CUDA_VISIBLE_DEVICES": "4,5,6"})
    assert cuda[cuda.index("--include") + 1] == "localhost:4,5" and "--num_gpus" not in cuda
    with pytest.raises(UsageError):
        launch_command(Launch(ranks=4), spec, "cuda", env={"CUDA_VISIBLE_DEVICES": "0"})
    hosts = (("a", 1), ("b", 1))
    nossh = launch_command(
        Launch(1, hosts, "/h", node_rank=1, master_addr="a"), spec, "cuda", env={}
    )
    assert nossh[nossh.index("--node_rank") + 1] == "1" and "--no_ssh" in nossh
    ssh = launch_command(Launch(1, hosts, "/h", launcher="slurm"), spec, "cuda", env={})
    assert ssh[ssh.index("--launcher") + 1] == "slurm" and "--no_ssh" not in ssh
    # DeepSpeed's runner accepts every argument iotune gives it
    from deepspeed.launcher.runner import parse_args

    for c in (cmd, cuda, nossh, ssh):
        args = parse_args(c[3:])
        assert args.module and args.no_local_rank and args.user_script == "iotune.workers.train"


def test_the_ranks_fork_from_the_zygote_that_serves_this_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With IOTUNE_ZYGOTE naming a live socket, DeepSpeed's launch, forked from the zygote,
    starts the zygote's client for each rank of this node, not a worker that imports torch
    itself; nodes of a hostfile go through DeepSpeed's runner, and ranks started over ssh on
    other nodes, which have no such socket, start plainly."""
    sock = tmp_path / "workers.sock"
    sock.touch()
    monkeypatch.setenv(ZYGOTE_ENV, str(sock))
    spec = tmp_path / "spec.json"
    forked = ["iotune.workers.zygote", "client", str(sock), "iotune.workers.train"]
    local = launch_command(Launch(ranks=2), spec, "cpu", env={})
    assert local[:4] == [sys.executable, "-m", "iotune.workers.launch", LOCAL_LAUNCH]
    assert local[-5:] == [*forked, str(spec)]
    hosts = (("a", 1), ("b", 1))
    nossh = launch_command(
        Launch(1, hosts, "/h", node_rank=1, master_addr="a"), spec, "cuda", env={}
    )
    assert nossh[-6:] == ["--module", *forked, str(spec)] and LOCAL_LAUNCH not in nossh
    ssh = launch_command(Launch(1, hosts, "/h", launcher="slurm"), spec, "cuda", env={})
    assert ssh[-3:] == ["--module", "iotune.workers.train", str(spec)]
    from deepspeed.launcher.launch import parse_args

    monkeypatch.setattr(sys, "argv", ["launch", *local[4:]])
    args = parse_args()
    assert args.module and args.no_local_rank and args.node_rank == 0
    assert args.training_script == "iotune.workers.zygote"
    assert args.training_script_args == ["client", str(sock), "iotune.workers.train", str(spec)]
    # GPUs that CUDA_VISIBLE_DEVICES names by index: the launch gets them; by UUID (which
    # DeepSpeed's --include cannot name) the runner's arguments, as without a zygote
    cuda = launch_command(Launch(ranks=2), spec, "cuda", env={"CUDA_VISIBLE_DEVICES": "4,5,6"})
    assert LOCAL_LAUNCH in cuda and f"--world_info={world_info([4, 5])}" in cuda
    uuid = launch_command(Launch(ranks=1), spec, "cuda", env={"CUDA_VISIBLE_DEVICES": "GPU-1a"})
    assert LOCAL_LAUNCH not in uuid and "--include" in uuid


@pytest.mark.parametrize(
    ("accelerator", "visible", "runner_args"),
    [
        ("cpu", "", ["--num_gpus", "2"]),
        ("cuda", "4,5,6", ["--include", "localhost:4,5"]),
    ],
)
def test_the_launch_gets_what_deepspeeds_runner_would_give_it(
    accelerator: str,
    visible: str,
    runner_args: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where a zygote serves, iotune starts DeepSpeed's launch without its runner: the
    launch's arguments are the ones DeepSpeed's own runner builds for the same ranks (its
    main() run here, its one subprocess caught), to the byte."""
    sock = tmp_path / "workers.sock"
    sock.touch()
    monkeypatch.setenv(ZYGOTE_ENV, str(sock))
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    spec = tmp_path / "spec.json"
    ours = launch_command(Launch(ranks=2), spec, accelerator, env={"CUDA_VISIBLE_DEVICES": visible})
    port = master_port(ours)
    assert port is not None and LOCAL_LAUNCH in ours
    from deepspeed.accelerator import get_accelerator
    from deepspeed.launcher import runner

    ran: list[list[str]] = []

    class Caught:
        returncode = 0

        def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
            ran.append(cmd)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(runner.subprocess, "Popen", Caught)
    # the devices DeepSpeed's runner checks --include against (a CPU host has none)
    monkeypatch.setattr(type(get_accelerator()), "device_count", lambda self: 8)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    module = module_args("iotune.workers.train")
    given = ["--hostfile", os.devnull, "--master_port", port, "--log_level", "error"]
    runner.main([*runner_args, *given, "--no_local_rank", "--module", *module, str(spec)])
    (cmd,) = ran
    assert cmd[:4] == [sys.executable, "-u", "-m", "deepspeed.launcher.launch"]
    assert sorted(cmd[4:]) == sorted(ours[4:])
    assert cmd[-5:] == ours[-5:]  # the module and its arguments, in their order


def _ev(event: str, step: int, rank: int, **kw: Any) -> dict[str, Any]:
    return {"event": event, "step": step, "rank": rank, "node": "n0", **kw}


def test_merge_ranks_takes_the_slowest_and_sums_memory() -> None:
    recs = [
        _ev(
            "step",
            1,
            1,
            step_s=2.0,
            optimizer_s=0.5,
            host_rss_peak_bytes=3,
            host_rss_bytes=2,
            tokens_per_s=10.0,
            loss=2.0,
            peak_accel_bytes=7,
            swap={"allocated": 5, "apparent": 5, "files": 2},
        ),
        _ev(
            "step",
            1,
            0,
            step_s=1.5,
            optimizer_s=0.9,
            host_rss_peak_bytes=4,
            host_rss_bytes=1,
            tokens_per_s=12.0,
            loss=4.0,
            peak_accel_bytes=9,
            swap={"allocated": 6, "apparent": 6, "files": 3},
        ),
        _ev("step", 2, 0, step_s=1.0, optimizer_s=0.4),
    ]
    one, two = merge_ranks(recs)
    assert (one["step_s"], one["optimizer_s"]) == (2.0, 0.9)  # each the slowest rank's
    assert one["host_rss_peak_bytes"] == 7 and one["tokens_per_s"] == 22.0
    assert one["peak_accel_bytes"] == 9 and one["loss"] == 3.0
    assert one["swap"] == {"allocated": 11, "apparent": 11, "files": 5}
    assert [r["rank"] for r in one["ranks"]] == [0, 1] and "rank" not in one
    assert two == recs[2]  # one rank's record is left as it is
    rows = per_rank([one, one])
    assert [(r["rank"], r["step_s"], r["swap_allocated"]) for r in rows] == [
        (0, 1.5, 6),
        (1, 2.0, 5),
    ]


def test_per_drive_rates_over_the_steady_step() -> None:
    steps = [{"step": 1, "step_s": 4.0}, {"step": 2, "step_s": 2.0}, {"step": 3, "step_s": 2.0}]
    io = [
        {
            "label": f"step:{n}",
            "drives": {"a": {"read": r, "write": w}, "b": {"read": r, "write": 0}},
        }
        for n, r, w in ((1, 1, 1), (2, 2 * GIB, GIB), (3, 2 * GIB, GIB))
    ]
    a, b = per_drive(io, steps)
    assert (a["drive"], a["read_gib_s"], a["write_gib_s"]) == ("a", 1.0, 0.5)
    assert (b["read_bytes"], b["write_gib_s"]) == (2 * GIB, 0.0)
    assert per_drive([], steps) == []


def test_a_busy_offload_directory_is_named(tmp_path: Path) -> None:
    assert swap_dir_users(tmp_path) == []
    held = tmp_path / "zero_stage_3" / "rank0.tensor.swp"
    held.parent.mkdir()
    held.write_bytes(b"x")
    data = tmp_path / "datasets" / "wiki.txt"  # open, but not a swap file
    data.parent.mkdir()
    data.write_text("x")
    with held.open("rb") as fh, data.open() as other:
        sleeper = subprocess.Popen(["sleep", "30"], stdin=fh, stdout=other)
    # until the child has exec'd it is a copy of this interpreter, named after it
    comm = Path(f"/proc/{sleeper.pid}/comm")
    while comm.read_text().strip() != "sleep":
        os.sched_yield()
    try:
        (tmp_path / f"iotune-swap-run-{sleeper.pid}").mkdir()
        (tmp_path / "iotune-swap-old-999999999").mkdir()  # no such process: a leftover
        users = swap_dir_users(tmp_path)
        assert any(f"iotune run {sleeper.pid} swaps in" in u for u in users)
        assert any(f"sleep (pid {sleeper.pid}) has {held} open" == u for u in users)
        assert not any("999999999" in u for u in users)
        assert not any("wiki.txt" in u for u in users)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_ranks_get_numa_local_offload_directories() -> None:
    a, b, c = Path("/mnt/a"), Path("/mnt/b"), Path("/mnt/c")
    # drives a, c on node 0, b on node 1; GPUs 0, 1 on node 0, GPUs 2, 3 on node 1
    paths, how = place([a, b, c], 4, [0, 1, 0], [0, 0, 1, 1])
    assert (paths, how) == ([a, c, b, b], "numa")
    # a NUMA node unknown on either side, or every drive on one node: round robin
    rr = [a, b, c, a]
    assert place([a, b, c], 4, [0, None, 0], [0, 0, 1, 1]) == (rr, "round robin")
    assert place([a, b, c], 4, [0, 1, 0], [0, 0, None, 1]) == (rr, "round robin")
    assert place([a, b, c], 4, [0, 0, 0], [0, 0, 1, 1]) == (rr, "round robin")
    # a GPU on a node without a drive: round robin for all
    assert place([a, b], 3, [0, 1], [0, 1, 2])[1] == "round robin"
    assert place([a], 2, [0], [0, 1]) == ([a, a], "round robin")


def test_only_this_runs_shared_memory_workspaces_are_removed(tmp_path: Path) -> None:
    # DeepSpeed's shm.cpp names them deepspeed_allreduce_buffer_UID_ADDR_PORT_RANK
    from iotune.workers.launch import master_port, remove_workspaces

    uid = os.getuid()
    mine = [tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_29611_{r}" for r in (0, 1)]
    others = [
        tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_29612_0",  # another port
        tmp_path / f"deepspeed_allreduce_buffer_{uid + 1}_127.0.0.1_29611_0",  # another user
        tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_296110_0",  # a longer port
    ]
    for f in mine + others:
        f.write_bytes(b"x")
    argv = ["--hostfile", "/dev/null", "--master_port", "29611", "--module", "m", "spec"]
    assert master_port(argv) == "29611"
    assert remove_workspaces(master_port(argv), tmp_path) == mine
    assert sorted(tmp_path.iterdir()) == sorted(others)
    assert remove_workspaces(None, tmp_path) == []


def test_each_ranks_copy_of_its_swap_folder_is_kept_in_the_merged_save() -> None:
    """--checkpoint-copy with ranks: each rank copies its own rank folder; the save's and the
    resume's records keep every rank's copy, in rank order."""
    copy = [{"copy": "aio", "target": f"ck/step1/offloaded_tensors/rank0{r}", "bytes": 10 + r}
            for r in range(2)]  # fmt: skip
    recs = [
        _ev("checkpoint", 1, r, swap_copy=[copy[r]], files=6, bytes=100, swap_copy_bytes=21)
        for r in (1, 0)
    ]
    recs += [_ev("init", 0, r, resume_copy=[copy[r]]) for r in (0, 1)]
    merged = {m["event"]: m for m in merge_ranks(recs)}
    assert merged["checkpoint"]["swap_copy"] == copy
    assert merged["checkpoint"]["bytes"] == 100 and merged["checkpoint"]["swap_copy_bytes"] == 21
    assert merged["init"]["resume_copy"] == copy


def test_a_traced_runs_workspaces_go_by_the_port_its_ranks_reported(tmp_path: Path) -> None:
    """`iotune trace -- COMMAND`: the ranks' reports name the port; at the run's end its
    workspaces go, another run's (another port) stay, and a report without one removes
    nothing."""
    import json as _json
    import os as _os

    from iotune.train.observe import remove_run_workspaces

    learn, shm = tmp_path / "learn", tmp_path / "shm"
    learn.mkdir()
    shm.mkdir()
    uid = _os.getuid()
    mine = [shm / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_29511_{r}" for r in (0, 1)]
    other = shm / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_29512_0"
    for f in (*mine, other):
        f.write_bytes(b"x")
    (learn / "engine-rank0.json").write_text(_json.dumps({"rank": 0, "master_port": "29511"}))
    (learn / "engine-rank1.json").write_text(_json.dumps({"rank": 1, "master_port": "29511"}))
    (learn / "engine-rank2.json").write_text(_json.dumps({"rank": 2, "master_port": None}))
    (learn / "engine-rank3.json").write_text("{not json")
    assert remove_run_workspaces(learn, shm) == mine
    assert [p.name for p in shm.iterdir()] == [other.name]
    assert remove_run_workspaces(tmp_path / "none", shm) == []


def test_more_ranks_than_gpus_is_one_line_naming_where_the_ranks_came_from(
    tmp_path: Path,
) -> None:
    """--ranks 4 on a host of 2 GPUs, and a hostfile giving this node 4 slots: each refused
    before anything runs, the second naming the hostfile's line to change."""
    from iotune.train.launch import Launch
    from iotune.train.preflight import Gpus, Refused
    from iotune.train.request import RunRequest
    from iotune.train.runner import prepare

    p = preset_with("gpu_baseline_1b", ("ranks=4",))
    two = Gpus("NVIDIA H200", 140 * 2**30, 2, (0, 0))
    req = RunRequest(p, tmp_path / "r", "diskstats", gpu=two, launch=Launch(ranks=4))
    with pytest.raises(Refused) as err:
        prepare(req)
    assert (err.value.message, err.value.hint) == (
        "4 ranks need 4 GPUs; this host has 2",
        "--ranks 2 or fewer (one rank per GPU)",
    )
    hosts = Launch(4, (("node-a", 4), ("node-b", 4)), "/etc/iotune/hosts", node_rank=1)
    req = RunRequest(p, tmp_path / "r", "diskstats", gpu=two, launch=hosts)
    with pytest.raises(Refused) as err:
        prepare(req)
    assert (err.value.message, err.value.hint) == (
        "/etc/iotune/hosts gives node node-b 4 slots, a rank each; this host has 2 GPU(s)",
        "'node-b slots=2' in the hostfile (one rank per GPU)",
    )
    # as many GPUs as ranks: prepared, the four counted
    four = Gpus("NVIDIA H200", 140 * 2**30, 4, (0, 0, 1, 1))
    done = prepare(RunRequest(p, tmp_path / "r", "diskstats", gpu=four, launch=hosts))
    assert done.res.gpu_count == 4


def test_a_resumes_checks_stay_one_a_step() -> None:
    """Rank 0 checks each resumed step the saving run also trained: one event a step, none
    with a ``step`` of its own (the run's step rows are the events that have one); merged,
    they stay apart, and beside the ranks' step records."""
    from iotune.train.ranks import merge_ranks

    recs = [
        {"event": "resume_check", "at_step": 3, "loss": 9.0, "ok": True, "rank": 0},
        {"event": "resume_check", "at_step": 4, "loss": 8.5, "ok": False, "rank": 0},
        {"event": "step", "step": 1, "loss": 9.0, "step_s": 1.0, "rank": 0},
        {"event": "step", "step": 1, "loss": 9.0, "step_s": 2.0, "rank": 1},
    ]
    merged = merge_ranks(recs)
    checks = [r for r in merged if r["event"] == "resume_check"]
    assert [(c["at_step"], c["loss"], c["ok"]) for c in checks] == [(3, 9.0, True), (4, 8.5, False)]
    (step,) = [r for r in merged if r["event"] == "step"]
    assert step["step_s"] == 2.0 and len(step["ranks"]) == 2
