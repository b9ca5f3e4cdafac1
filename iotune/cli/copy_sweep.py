"""`iotune sweep-checkpoint --copy-from OFFLOAD_DIR`: the copy a save makes of NVMe-offloaded
optimizer state, swept against its ceiling (iotune.sweep.copysweep has the points and the
summary; each copy runs in a worker, iotune.workers.copy_point)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import click

from iotune import proc
from iotune.cli.options import STATE, comma_list, positive_int
from iotune.errors import CommandFailed, IotuneError, NotRootError, UsageError, last_line
from iotune.records import append_record
from iotune.render import console, emit_json, err_console
from iotune.sweep import copysweep as cs

#: the swap folder's name in the offload folder, and the copies' in the checkpoint folder
SWAP = "iotune-copy-swap"
COPY = "iotune-copy"


def _say(message: str) -> None:
    if not STATE.json:
        err_console().print(message, soft_wrap=True, highlight=False)


def check_folders(src: Path, dst: Path, need: int) -> None:
    """Two folders, not one inside the other, each with room for the swap folder."""
    for what, d in (("--copy-from", src), ("--target", dst)):
        if not d.is_dir():
            raise UsageError(f"{what} {d} is not a directory", hint=f"{what} DIR (it must exist)")
    if src == dst or src in dst.parents or dst in src.parents:
        raise UsageError(
            f"--copy-from {src} and --target {dst} are one folder, or one holds the other",
            hint="a folder on the offload volume and one on the checkpoint volume",
        )
    for what, d in (("--copy-from", src), ("--target", dst)):
        free = shutil.disk_usage(d).free
        if free < need * 1.05:
            raise UsageError(
                f"{what} {d} has {free / 2**30:.2f} GiB free; the swap folder takes "
                f"{need / 2**30:.2f} GiB",
                hint="fewer --params, or a folder with room",
            )


def _worker(req: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One request of iotune.workers.copy_point, as a record: ``status`` ok or failed."""
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json") as fh:
        json.dump(req, fh)
        fh.flush()
        try:
            got = proc.run_worker("iotune.workers.copy_point", fh.name, timeout=timeout)
        except CommandFailed as exc:
            return {"status": "failed", "error": last_line(exc.stderr_tail) or str(exc)}
    return {"status": "ok", **got}


def sub_group(text: str) -> int:
    """--sub-group-size: a parameter count, refused in its own option's name."""
    from iotune.sweep.threads import parse_params

    try:
        return parse_params(text)
    except UsageError as exc:
        raise UsageError(
            f"--sub-group-size {text!r} is not a parameter count", hint="e.g. 1e9"
        ) from exc


def run_copy_sweep(
    spec: dict[str, Any], run_dir: Path, space: cs.CopySpace, timeout: float
) -> dict[str, Any]:
    """The swap folder made (or found whole, resuming), every round's points, the result
    written; the swap folder removed at the end, a copy left by an interrupt too."""
    from iotune.workers.swapcopy import clone_problem

    src, dst = Path(spec["copy_from"]), Path(spec["target"])
    sizes = [int(s) for s in spec["sizes"]]
    swap, into = src / SWAP, dst / COPY
    records = cs.load_points(run_dir)
    problem = clone_problem(src, dst)
    pts = cs.points(space, reflink=problem is None)
    done = {(r["round"], cs.label(r)) for r in records}
    left = [p for r in range(int(spec["rounds"])) for p in pts if (r, cs.label(p)) not in done]
    have = sorted(p.stat().st_size for p in swap.iterdir()) if swap.is_dir() else []
    if left and have != sorted(sizes):
        shutil.rmtree(swap, ignore_errors=True)
        _say(
            f"iotune: the swap folder of {spec['params']:,} parameters, {len(sizes)} files, "
            f"{sum(sizes) / 2**30:.2f} GiB, written O_DIRECT in {swap}"
        )
        made = _worker({"op": "make", "folder": str(swap), "sizes": sizes}, timeout)
        if made["status"] != "ok":
            raise IotuneError(
                f"the swap folder could not be written in {src}: {made['error']}",
                hint="--debug shows the worker's output",
            )
    _say(
        f"iotune: {len(pts)} copies a round x {spec['rounds']} round(s) into {dst}, "
        f"{len(left)} to time"
        + (f" (no reflink: {problem})" if problem else "")
        + f"; records in {run_dir}"
    )

    def one(p: dict[str, Any]) -> dict[str, Any]:
        req: dict[str, Any] = {"src": str(swap), "dst": str(into)}
        if p["copy"] == "ceiling":
            rec = _worker({**req, "op": "ceiling"}, timeout)
            shutil.rmtree(into, ignore_errors=True)
            if rec["status"] == "ok":
                rec = {
                    "status": "ok",
                    "durable_s": rec["seconds"],
                    "blocked_s": rec["seconds"],
                    "bytes": rec["bytes"],
                    "best": {k: rec[k] for k in ("block_size", "queue_depth", "threads")},
                    "rows": rec["rows"],
                }
        else:
            rec = _worker(
                {**req, "op": "copy", "copy": p["copy"], "settings": p.get("settings")}, timeout
            )
            if rec["status"] == "ok" and not rec["same"]:
                rec = {**rec, "status": "failed", "error": "the copy differs from the swap files"}
        shown = (
            f"{rec['bytes'] / rec['durable_s'] / 2**30:.2f} GiB/s, durable in {rec['durable_s']:.2f} s"
            if rec["status"] == "ok"
            else f"failed: {rec['error']}"
        )
        _say(f"iotune: {cs.label(p)}: {shown}")
        return rec

    interrupted = False
    try:
        records = cs.run_rounds(
            pts,
            int(spec["rounds"]),
            records,
            one,
            lambda rec: append_record(run_dir / cs.COPY_POINTS, rec),
        )
    except KeyboardInterrupt:
        interrupted = True
    finally:
        shutil.rmtree(into, ignore_errors=True)
        if not interrupted:
            shutil.rmtree(swap, ignore_errors=True)
    result = {
        **cs.summarize(records),
        "params": spec["params"],
        "bytes": sum(sizes),
        "files": len(sizes),
        "copy_from": str(src),
        "target": str(dst),
        "reflink": problem is None,
        "reflink_problem": problem,
        "out": str(run_dir),
        "interrupted": interrupted,
    }
    (run_dir / cs.COPY_RESULT).write_text(json.dumps(result, indent=2) + "\n")
    return result


def show(result: dict[str, Any]) -> None:
    """The result as a table and its lines, or --json."""
    if STATE.json:
        emit_json(result)
        return
    from rich.table import Table

    gib = 2**30
    t = Table(
        box=None,
        pad_edge=False,
        header_style="bold",
        title=f"the swap files' copy, {result['bytes'] / gib:.2f} GiB in {result['files']} files "
        f"(GiB = 2^30 bytes; medians of {max((r['rounds'] for r in result['rows']), default=0)} "
        "round(s))",
    )
    for col in ("COPY", "GiB/s", "DURABLE s", "COPY s (NO FSYNC)", "ROUNDS"):
        t.add_column(col, justify="left" if col == "COPY" else "right")
    for r in result["rows"]:
        ok = r["bw_bytes_s"] is not None
        t.add_row(
            r["point"],
            f"{r['bw_bytes_s'] / gib:.2f}" if ok else "-",
            f"{r['durable_s']:.2f}" if ok else "-",
            f"{r['blocked_s']:.2f}" if ok else "-",
            f"{r['rounds']}" + (f" ({r['failed']} failed: {r['error']})" if r["failed"] else ""),
        )
    con = console()
    con.print(t)
    best = result["best"]
    if best is not None:
        s = best["settings"]
        con.print(
            f"best aio copy: {best['point']}: {best['bw_bytes_s'] / gib:.2f} GiB/s"
            + (
                f", {result['of_ceiling']:.2f} of the ceiling's rate"
                if result["of_ceiling"] is not None
                else ""
            )
            + (
                f", {result['over_deepspeed']:.2f}x DeepSpeed's copy to durability"
                if result["over_deepspeed"] is not None
                else ""
            )
            + " (medians of the rounds' ratios)",
            soft_wrap=True,
        )
        con.print(
            "  a run copies with its aio section's settings (--checkpoint-copy aio): "
            f'"aio": {{"block_size": {s["block_size"]}, "queue_depth": {s["queue_depth"]}, '
            f'"intra_op_parallelism": {s["intra_op_parallelism"]}}}',
            soft_wrap=True,
            highlight=False,
        )
    if result["reflink_problem"]:
        con.print(f"  reflink: not swept ({result['reflink_problem']})", soft_wrap=True)
    con.print(f"  records: {result['out']}", soft_wrap=True, highlight=False)


#: the copy sweep's grid where --block-size, --queue-depth and --threads are not given
COPY_DEFAULTS = {"block_size": "1M,8M", "queue_depth": "32,64", "threads": "4,8"}


def copy_spec(
    copy_from: str,
    target: str | None,
    params: str,
    sub_group_size: str,
    block_size: str,
    queue_depth: str,
    threads: str,
    rounds: int,
) -> dict[str, Any]:
    """--copy-from's run, from the options: the grid (the copy's own defaults where the
    writer's were left), the swap files' sizes, the folders."""
    from click.core import ParameterSource

    from iotune.sweep.threads import parse_params
    from iotune.units import parse_size

    if not target:
        raise UsageError(
            "--copy-from copies into --target, which is required",
            hint="iotune sweep-checkpoint --copy-from /mnt/offload --target /mnt/ckpt",
        )
    ctx = click.get_current_context()
    given = {
        k: v if ctx.get_parameter_source(k) != ParameterSource.DEFAULT else COPY_DEFAULTS[k]
        for k, v in (("block_size", block_size), ("queue_depth", queue_depth), ("threads", threads))
    }
    space = cs.CopySpace(
        block_size=comma_list(
            given["block_size"], lambda t: parse_size(t, what="--block-size"), "--block-size"
        ),
        queue_depth=comma_list(
            given["queue_depth"], positive_int("--queue-depth"), "--queue-depth"
        ),
        threads=comma_list(given["threads"], positive_int("--threads"), "--threads"),
    )
    n = parse_params(params)
    sub = sub_group(sub_group_size)
    return {
        "copy_from": str(Path(copy_from).resolve()),
        "target": str(Path(target).resolve()),
        "params": n,
        "sub_group": sub,
        "sizes": cs.swap_sizes(n, sub),
        "rounds": rounds,
        "space": {
            "block_size": space.block_size,
            "queue_depth": space.queue_depth,
            "threads": space.threads,
        },
    }


def copy_mode(spec: dict[str, Any], run_dir: Path, timeout: float) -> None:
    """--copy-from (or --resume of such a run): checked, run, shown."""
    space = cs.CopySpace(**{k: tuple(v) for k, v in spec["space"].items()})
    need = sum(int(x) for x in spec["sizes"])
    if os.geteuid() != 0:
        raise NotRootError("iotune sweep-checkpoint (drops the page cache before each copy)")
    if not (run_dir / "spec.json").is_file():
        check_folders(Path(spec["copy_from"]), Path(spec["target"]), need)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(spec, indent=2) + "\n")
    result = run_copy_sweep(spec, run_dir, space, timeout)
    show(result)
    if result["interrupted"]:
        raise SystemExit(130)
    if result["best"] is None:
        raise IotuneError(
            "no aio copy succeeded",
            hint=f"the errors are in {run_dir}; --debug shows the workers' output",
        )
