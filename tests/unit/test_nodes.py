"""Several nodes over pdsh: the node's command, DeepSpeed's pdsh command with iotune's node
entry in it, the entry's reading of DeepSpeed's launch arguments, a node's row. Pure logic;
the root tier runs it on two real nodes (tests/root/test_nodes_root.py)."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from iotune.proc import ZYGOTE_ENV
from iotune.train.launch import Launch, launch_command, plan_launch, ssh_command
from iotune.train.nodes import node_argv, node_row
from iotune.workers.node import decode, encode, node_command, parse
from iotune.workers.pdsh_nodes import ENTRY, swap_kill, swap_launch


def test_every_node_runs_this_command_with_its_own_run_directory() -> None:
    out = Path("/runs/r1")
    argv = ["--json", "trace", "--run", "tiny_opt_nvme", "--hostfile", "hf", "--out", "x"]
    assert node_argv(argv, out) == [
        "trace", "--run", "tiny_opt_nvme", "--hostfile", "hf", "--out", "/runs/r1",
    ]  # fmt: skip
    # the forms click takes: --opt=value and --opt value; the node's rank and master
    # address are DeepSpeed's to give
    argv = ["run", "p", "--out=x", "--launcher", "pdsh", "--master-addr=a", "--steps", "2"]
    assert node_argv(argv, out) == ["run", "p", "--steps", "2", "--out", "/runs/r1"]


def test_deepspeeds_pdsh_command_runs_the_node_entry_and_its_kill_stops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DeepSpeed's own PDSHRunner builds the command; only the launch module changes."""
    import argparse

    from deepspeed.launcher.multinode_runner import PDSHRunner

    args = argparse.Namespace(
        launcher_args="", ssh_port=None, master_addr="10.0.0.1", master_port=29500,
        venv_script=None, no_python=False, module=True, no_local_rank=True, save_pid=False,
        enable_each_rank_log="None", user_script="iotune.workers.train", user_args=["PAYLOAD"],
    )  # fmt: skip
    runner = PDSHRunner(args, "d29ybGQ=")
    cmd, kill, _ = runner.get_cmd({}, {"a": [0], "b": [0]})
    mine = swap_launch(cmd)
    at = mine.index(ENTRY)
    assert mine[at - 3 : at] == [sys.executable, "-u", "-m"]
    assert "deepspeed.launcher.launch" not in mine and mine[-1] == "PAYLOAD"
    assert "--node_rank=%n" in mine and mine[: mine.index("-w") + 2][-1] == "a,b"
    killed = swap_kill(kill)
    assert killed[:-1] == kill[:-1] and killed[-1].endswith("-m\\ iotune.workers.node")
    assert "deepspeed" not in killed[-1]
    with pytest.raises(RuntimeError, match="does not run"):
        swap_launch(["pdsh", "-w", "a", "python", "script.py"])


def test_the_node_entry_reads_deepspeeds_launch_arguments() -> None:
    world = base64.urlsafe_b64encode(json.dumps({"a": [0, 1], "b": [0, 1]}).encode()).decode()
    payload = {"argv": ["run", "tiny_opt_nvme", "--out", "/o"], "out": "/o"}
    word = encode(payload)
    assert " " not in word and decode(word) == payload
    args = [
        f"--world_info={world}", "--node_rank=1", "--master_addr=a", "--master_port=29500",
        "--module", "--no_local_rank", "iotune.workers.train", word,
    ]  # fmt: skip
    host, rank, master, got = parse(args)
    assert (host, rank, master, got) == ("b", 1, "a", payload)
    cmd = node_command(got, rank, master)
    assert cmd[:3] == [sys.executable, "-m", "iotune"]
    assert cmd[3:] == [
        "run",
        "tiny_opt_nvme",
        "--out",
        "/o",
        "--node-rank",
        "1",
        "--master-addr",
        "a",
    ]


def test_the_launch_over_pdsh_names_its_master_and_skips_deepspeeds_plain_ssh_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ZYGOTE_ENV, raising=False)
    hf = tmp_path / "hostfile"
    hf.write_text("node-a slots=1\nnode-b slots=1\n")
    la = plan_launch(None, str(hf), None, None, None)
    assert la is not None and la.over_pdsh and la.master_addr == "node-a"
    cmd = launch_command(la, "PAYLOAD", "cpu", env={})
    assert "--no_ssh_check" in cmd and cmd[cmd.index("--master_addr") + 1] == "node-a"
    assert cmd[-3:] == ["--module", "iotune.workers.train", "PAYLOAD"]
    # other launchers keep DeepSpeed's own check; --node-rank is no launch over pdsh
    slurm = launch_command(Launch(1, la.hosts, str(hf), launcher="slurm"), "P", "cpu", env={})
    assert "--no_ssh_check" not in slurm
    assert not Launch(1, la.hosts, str(hf), node_rank=0).over_pdsh


def test_ssh_takes_pdshs_own_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDSH_SSH_ARGS_APPEND", "-i /k/id -o UserKnownHostsFile=/k/known -p 2222")
    argv = ssh_command("node-b", "true")
    assert argv[0] == "ssh" and argv[-2:] == ["node-b", "true"]
    assert argv[argv.index("-i") + 1] == "/k/id" and argv[argv.index("-p") + 1] == "2222"
    assert "BatchMode=yes" in argv
    monkeypatch.delenv("PDSH_SSH_ARGS_APPEND")
    assert "-i" not in ssh_command("node-b", "true")


def _run_doc() -> dict[str, Any]:
    io = {"read": {"bytes": 10}, "write": {"bytes": 20}}
    return {
        "ranks": 1,
        "world": 2,
        "drives": ["loop3"],
        "backend": "libbpf",
        "steps_done": 2,
        "footprint": {"allocated": 100, "estimate": 100},
        "table": [
            {"case": "init + first step", "read_bytes": 5, "write_bytes": 9},
            {
                "case": "steady step (median of 1)",
                "read_bytes": 10,
                "write_bytes": 21,
                "read_focus": 1,
                "write_focus": 2,
                "read_other": 0,
                "write_other": 1,
                "step_s": 1.5,
                "optimizer_s": 0.5,
            },
        ],
        "estimate_table": [
            {"case": "estimate: init + first step", "read_bytes": 5, "write_bytes": 8},
            {"case": "estimate: steady step", "read_bytes": 10, "write_bytes": 20},
        ],
        "io_steps": [{"label": "init", **io}, {"label": "step:1", **io}, {"label": "step:2", **io}],
    }


def test_a_nodes_row_is_its_steady_step_beside_its_ranks_model(tmp_path: Path) -> None:
    node = {"hostname": "node-b", "exit_code": 0, "error": None, "hint": None}
    row = node_row("10.0.0.3", node, _run_doc(), tmp_path)
    assert row["hostname"] == "node-b" and row["exit_code"] == 0 and row["error"] is None
    assert row["case"].startswith("steady") and row["drives"] == ["loop3"]
    assert row["measured"]["read_bytes"] == 10 and row["measured"]["write_focus"] == 2
    assert row["model"] == {"read_bytes": 10, "write_bytes": 20}
    assert [s["label"] for s in row["steps"]] == ["step:1", "step:2"]
    # one step only: the first step against its own estimate
    one = _run_doc()
    one["table"] = one["table"][:1]
    assert node_row("n", node, one, tmp_path)["model"] == {"read_bytes": 5, "write_bytes": 8}
    # a node that left nothing says so; one that failed keeps its own line and hint
    assert "no records" in node_row("n", None, None, tmp_path)["error"]
    failed = node_row(
        "n", {**node, "exit_code": 1, "error": "x needs 9 GiB", "hint": "h"}, None, tmp_path
    )
    assert (failed["exit_code"], failed["error"], failed["hint"]) == (1, "x needs 9 GiB", "h")


def test_a_nodes_steps_count_its_offload_drives_not_its_checkpoint_volume(
    tmp_path: Path,
) -> None:
    """A node whose run traced a checkpoint volume beside its offload drives: each step's
    bytes in its row are the offload drives' (the step row's ``primary``), as the node's own
    run table prints them; a save's interval is not a step and stays out."""
    doc = _run_doc()
    doc["drives"] = ["loop3", "loop4"]
    both = {"read": {"bytes": 10}, "write": {"bytes": 20 + 7}}
    offload = {"read": {"bytes": 10}, "write": {"bytes": 20}}
    doc["io_steps"] = [
        {"label": "init", **both, "primary": offload},
        {"label": "step:1", **both, "primary": offload},
        {"label": "save:1", "read": {"bytes": 0}, "write": {"bytes": 99}},
        {"label": "step:2", **both, "primary": offload},
    ]
    node = {"hostname": "node-b", "exit_code": 0, "error": None, "hint": None}
    row = node_row("10.0.0.3", node, doc, tmp_path)
    assert row["steps"] == [
        {"label": "step:1", "read_bytes": 10, "write_bytes": 20},
        {"label": "step:2", "read_bytes": 10, "write_bytes": 20},
    ]


def test_the_run_shows_a_row_and_draws_a_figure_per_node(tmp_path: Path) -> None:
    from rich.console import Console

    from iotune.train.nodes import draw_nodes, print_nodes

    node = {"hostname": "node-a", "exit_code": 0, "error": None, "hint": None}
    rows = [
        node_row("10.0.0.2", node, _run_doc(), tmp_path / "10.0.0.2"),
        node_row("10.0.0.3", {**node, "hostname": "node-b", "exit_code": 2, "error": "no dir"},
                 None, tmp_path / "10.0.0.3"),
    ]  # fmt: skip
    assert draw_nodes(tmp_path, rows) == ["node-10.0.0.2.png"]  # the other left no records
    assert (tmp_path / "node-10.0.0.2.png").read_bytes()[:4] == b"\x89PNG"
    doc = {"preset": "tiny_opt_nvme", "nodes": 2, "world": 2, "out": str(tmp_path),
           "per_node": rows, "figures": ["node-10.0.0.2.png"]}  # fmt: skip
    con = Console(record=True, width=200)
    print_nodes(con, doc)
    text = con.export_text()
    assert "10.0.0.2" in text and "node-a" in text and "loop3" in text and "ok" in text
    assert "exit 2: no dir" in text and "figures: node-10.0.0.2.png" in text
