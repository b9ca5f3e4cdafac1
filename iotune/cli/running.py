"""A training run from the command line, shared by `iotune run` and `iotune trace --run`:
the request from the options (iotune.train.request), the estimate and what is about to run
on stderr, the run, its table or its JSON, and the exit code of what happened."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from iotune.cli.options import STATE, exit_if_path_lost, interrupted_exit, workload_exit
from iotune.errors import IotuneError
from iotune.render import console, emit_json, err_console, warn
from iotune.train.request import Prepared, RunRequest


def run_preset(
    name: str | None,
    backend: str,
    out: str | None,
    nvme_path: str | None,
    steps: int | None,
    sets: tuple[str, ...],
    data: str | None,
    tokenizer: str | None,
    aio_config: str | None,
    force: bool,
    keep_swap: bool,
    threads_config: str | None = None,
    baseline: str | None = None,
    interval: float = 1.0,
    focus: int | None = None,
    ranks: int | None = None,
    hostfile: str | None = None,
    node_rank: int | None = None,
    master_addr: str | None = None,
    launcher: str | None = None,
    model: str | None = None,
    ds_config: str | None = None,
    micro_batch: int | None = None,
    seq_len: int | None = None,
    ga: int | None = None,
    checkpoint_every: int | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_writer: str | None = None,
    resume_from: str | None = None,
    checkpoint_copy: str = "deepspeed",
    checkpoint_persist: str | None = None,
) -> None:
    """Prepare (and refuse what will not fit), run, render, exit with the worker's status."""
    from iotune.plan.measured import measured_inputs
    from iotune.train import runner as train_runner
    from iotune.train.render import print_run
    from iotune.train.request import make_request

    req = make_request(
        name,
        backend,
        out,
        nvme_path,
        steps,
        sets,
        data,
        tokenizer,
        aio_config,
        force,
        keep_swap,
        interval=interval,
        focus=focus,
        ranks=ranks,
        hostfile=hostfile,
        node_rank=node_rank,
        master_addr=master_addr,
        launcher=launcher,
        model=model,
        ds_config=ds_config,
        micro_batch=micro_batch,
        seq_len=seq_len,
        ga=ga,
        quiet=STATE.json,
        checkpoint_every=checkpoint_every,
        checkpoint_dir=checkpoint_dir,
        checkpoint_writer=checkpoint_writer,
        resume_from=resume_from,
        checkpoint_copy=checkpoint_copy,
        checkpoint_persist=checkpoint_persist,
    )
    if req.launch is not None and req.launch.over_pdsh:
        # every node prepares its own part (its drives, its space, its memory)
        _run_nodes(req)
        return
    prep = train_runner.prepare(req)
    req.bandwidth, req.adam, req.baseline = measured_inputs(
        prep.preset, prep.cfg, aio_config, threads_config, baseline
    )
    for note in req.notes:
        warn(note)
    if not STATE.json:
        _announce(prep, backend, req.out)
    result = train_runner.run(req, prep)
    if STATE.json:
        emit_json(result)
    else:
        print_run(console(), result)
    _exit_after_run(result)


def _run_nodes(req: RunRequest) -> None:
    """Every node of the hostfile over pdsh, each tracing its own drives; a row per node."""
    from iotune.train.nodes import argv_here, print_nodes, run_nodes

    launch = req.launch
    if launch is None:
        return
    for note in req.notes:
        warn(note)
    if not STATE.json:
        click.echo(
            f"iotune: running {req.preset.name} on {launch.nodes} nodes ({launch.world} ranks) "
            f"through DeepSpeed's pdsh launcher, each node tracing its own drives; results in "
            f"{req.out}",
            err=True,
        )
    doc = run_nodes(req, argv_here())
    if STATE.json:
        emit_json(doc)
    else:
        print_nodes(console(), doc)
    if doc["interrupted"]:
        click.echo(
            f"iotune: interrupted ({doc['interrupted']}); each node's records kept in {req.out}",
            err=True,
        )
        sys.exit(interrupted_exit(doc["interrupted"]))
    # the node that failed first (the others were stopped after it), else any that failed
    failed = [r for r in doc["per_node"] if r["exit_code"] != 0]
    bad = next((r for r in failed if r["node"] == doc.get("first_failed")), None) or next(
        iter(failed), None
    )
    if bad is not None:
        code = bad["exit_code"]
        raise IotuneError(
            f"node {bad['node']} failed"
            + (f" (exit {code})" if code is not None else "")
            + (f": {bad['error']}" if bad.get("error") else ""),
            hint=bad.get("hint") or "its own lines are above, each prefixed with its name by pdsh",
        )
    if doc["exit_code"]:
        raise IotuneError(
            f"DeepSpeed's pdsh launcher exited {doc['launcher_exit']}",
            hint="its output is above; rerun with --debug for iotune's own log",
        )


def _announce(prep: Prepared, backend: str, out_dir: Path) -> None:
    """The estimate and what is about to run, on stderr."""
    from iotune.plan.render import print_estimate

    print_estimate(err_console(), prep.preset, prep.est, prep.cfg)
    what = (
        f"{', '.join(prep.targets.disks)} ({backend})"
        if prep.targets.disks
        else "no drive (no NVMe offload)"
    )
    ranks = f" on {prep.preset.ranks} ranks" if prep.preset.ranks > 1 else ""
    click.echo(
        f"iotune: running {prep.preset.name}{ranks} for {prep.preset.steps} steps, tracing {what}; "
        f"results in {out_dir}",
        err=True,
    )


def _exit_after_run(result: dict[str, Any]) -> None:
    exit_if_path_lost(result)
    if result["interrupted"]:
        click.echo(
            f"iotune: interrupted ({result['interrupted']}) after {result['steps_done']} step(s); "
            f"records kept in {result['out']}",
            err=True,
        )
        sys.exit(interrupted_exit(result["interrupted"]))
    code = result["exit_code"]
    check = result.get("resume_check") or {}
    if code and check.get("ok") is False:
        raise IotuneError(
            check["message"],
            hint="the checkpoint does not hold the state this model's run saved: resume from "
            "a save of the same model, config and data (iotune run --checkpoint-every)",
        )
    if code:
        click.echo(
            f"iotune: the training worker failed (exit {code}) after {result['steps_done']} step(s)"
            + (f": {result['error']}" if result.get("error") else ""),
            err=True,
        )
        click.echo("hint: its output is above; rerun with --debug for iotune's own log", err=True)
        sys.exit(workload_exit(code))
