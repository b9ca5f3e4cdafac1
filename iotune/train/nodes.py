"""Several nodes over ssh, each tracing its own drives: ``iotune run``/``trace --run`` with a
hostfile and DeepSpeed's pdsh launcher.

DeepSpeed's runner logs in to every node of the hostfile with pdsh and starts iotune's node
entry there (iotune.workers.pdsh_nodes, iotune.workers.node), which runs this same iotune
command with ``--node-rank``: each node makes its own estimate and refusals, starts its own
ranks, traces the drives behind its own offload path and keeps its records in OUT/NODE. When
they are done, this node gathers them (from a shared OUT, or over ssh where OUT is each
node's own) into one run: nodes.json with a row per node, each node's bytes beside the model
of its ranks, and a figure per node (node-NODE.png).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from iotune import proc
from iotune.records import to_jsonable
from iotune.trace.model import step_io
from iotune.trace.workload import Terminated, raise_terminated, stop_child
from iotune.train.request import RunRequest
from iotune.units import GIB
from iotune.workers.node import END, NODE_FILE

NODES_RESULT = "nodes.json"
_END = re.compile(
    re.escape(END).replace(r"\{host\}", r"(?P<host>\S+)").replace(r"\{code\}", r"(?P<code>-?\d+)")
)
#: the options this node's command has that each node's must not: each node's run directory
#: is OUT/NODE, its rank and master address come from DeepSpeed's launcher
_OWN = ("--out", "--launcher", "--master-addr", "--node-rank")


def node_argv(argv: Sequence[str], out: Path) -> list[str]:
    """The iotune arguments every node runs: this command's (``sys.argv[1:]``) without
    ``--json`` and the options in _OWN, with ``--out`` the run directory. Pure."""
    keep: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--json":
            pass
        elif a.split("=", 1)[0] in _OWN:
            skip = "=" not in a
        else:
            keep.append(a)
    return [*keep, "--out", str(out)]


def run_nodes(req: RunRequest, argv: Sequence[str]) -> dict[str, Any]:
    """Start every node's part through DeepSpeed's pdsh launcher, wait, gather. Each node
    prepares its own part: this one only checks that the run directory is new."""
    from iotune.errors import UsageError
    from iotune.train.launch import launch_command
    from iotune.workers.launch import NODES_ENV
    from iotune.workers.node import encode

    launch = req.launch
    if launch is None:  # only called for a launch over ssh
        raise ValueError("run_nodes needs a launch")
    out = req.out
    if out.exists() and any(out.iterdir()):
        raise UsageError(
            f"run directory {out} is not empty",
            hint="name a new --out directory (a run's records are never mixed with another's)",
        )
    out.mkdir(parents=True, exist_ok=True)
    payload = encode({"argv": node_argv(argv, out), "out": str(out)})
    command = launch_command(launch, payload, req.preset.accelerator)
    (out / "command.json").write_text(json.dumps(command) + "\n")
    child = subprocess.Popen(
        command,
        env={**os.environ, **proc.worker_env(), NODES_ENV: "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    first_failed: list[str] = []
    pump = threading.Thread(target=_pump, args=(child, first_failed), daemon=True)
    pump.start()
    interrupted = None
    old = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        child.wait()
    except KeyboardInterrupt:
        interrupted = "SIGINT"
    except Terminated:
        interrupted = "SIGTERM"
    finally:
        signal.signal(signal.SIGTERM, old)
        if child.poll() is None:
            # DeepSpeed's runner stops every node's entry (pdsh pkill -f), which stops its
            # ranks and keeps its records
            stop_child(child, signal.SIGINT, group=True, patience=90.0)
    pump.join(timeout=10)
    rows = [gather(out, host) for host, _ in launch.hosts]
    doc = nodes_result(req, rows, child.returncode, interrupted)
    doc["first_failed"] = first_failed[0] if first_failed else None
    doc["figures"] = draw_nodes(out, rows)
    (out / NODES_RESULT).write_text(json.dumps(to_jsonable(doc), indent=2) + "\n")
    return doc


def _pump(child: subprocess.Popen[str], first_failed: list[str]) -> None:
    """The launcher's output (every node's lines, pdsh's prefix on each) to stderr; the first
    node whose entry ends with a failure stops the others (DeepSpeed's runner, on SIGINT,
    stops every node's entry), whose ranks would wait for it until gloo's timeout."""
    for line in child.stdout or ():
        sys.stderr.write(line)
        sys.stderr.flush()
        m = _END.search(line)
        if m and int(m["code"]) != 0 and not first_failed:
            first_failed.append(m["host"])
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGINT)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def gather(out: Path, host: str) -> dict[str, Any]:
    """One node's row: its run.json and node.json from OUT/HOST, copied from the node over
    ssh (tar) first where this node does not see them (OUT is not shared)."""
    from iotune.train.launch import ssh_command

    mine = out / host
    if not (mine / NODE_FILE).exists():
        pack = subprocess.run(
            ssh_command(host, "tar", "-C", str(out), "-cf", "-", host),
            capture_output=True,
            check=False,
            timeout=600,
        )
        if pack.returncode == 0 and pack.stdout:
            subprocess.run(["tar", "-xf", "-", "-C", str(out)], input=pack.stdout, check=False)
    return node_row(host, _read(mine / NODE_FILE), _read(mine / "run.json"), mine)


def _case(doc: dict[str, Any], rows: str, prefix: str) -> dict[str, Any] | None:
    return next((r for r in doc.get(rows, []) if r["case"].startswith(prefix)), None)


def node_row(
    host: str, node: dict[str, Any] | None, run: dict[str, Any] | None, out: Path
) -> dict[str, Any]:
    """A node's figures from its own records: the steady step (the first step where there is
    only one) measured, and the model of that node's ranks. Pure."""
    row: dict[str, Any] = {
        "node": host,
        "hostname": (node or {}).get("hostname"),
        "out": str(out),
        "exit_code": (node or {}).get("exit_code"),
        "error": (node or {}).get("error")
        or (None if node else "no records from this node (its entry did not finish)"),
        "hint": (node or {}).get("hint"),
    }
    if run is None:
        return row
    prefix = "steady" if _case(run, "table", "steady") else "init + first"
    measured = _case(run, "table", prefix) or {}
    model = _case(run, "estimate_table", f"estimate: {prefix}") or {}
    # a step's I/O over the node's offload drives alone, as its run's own tables count it
    # (a checkpoint or persist volume traced beside them keeps its saves' writes apart)
    steps = [
        step_io(s) for s in run.get("io_steps", []) if str(s.get("label", "")).startswith("step:")
    ]
    row.update(
        ranks=run.get("ranks"),
        world=run.get("world"),
        drives=run.get("drives"),
        backend=run.get("backend"),
        focus_size=run.get("focus_size"),
        steps_done=run.get("steps_done"),
        footprint=run.get("footprint"),
        case=measured.get("case"),
        measured={
            k: measured.get(k)
            for k in (
                "read_bytes",
                "write_bytes",
                "read_focus",
                "write_focus",
                "read_other",
                "write_other",
                "step_s",
                "optimizer_s",
            )
        },
        model={"read_bytes": model.get("read_bytes"), "write_bytes": model.get("write_bytes")},
        steps=[
            {
                "label": s["label"],
                "read_bytes": s["read"]["bytes"],
                "write_bytes": s["write"]["bytes"],
            }
            for s in steps
        ],
        steady_model=(_case(run, "estimate_table", "estimate: steady") or {}),
    )
    return row


def nodes_result(
    req: RunRequest,
    rows: list[dict[str, Any]],
    launcher_exit: int | None,
    interrupted: str | None,
) -> dict[str, Any]:
    launch = req.launch
    failed = [r for r in rows if r["exit_code"] != 0]
    return {
        "preset": req.preset.name,
        "out": str(req.out),
        "launcher": launch.launcher if launch else None,
        "hostfile": launch.hostfile if launch else None,
        "master_addr": launch.master_addr if launch else None,
        "nodes": len(rows),
        "world": launch.world if launch else None,
        "steps_requested": req.preset.steps,
        "per_node": rows,
        "launcher_exit": launcher_exit,
        "exit_code": 0 if not failed and not launcher_exit else 1,
        "interrupted": interrupted,
        "failed": [r["node"] for r in failed],
    }


def draw_nodes(out: Path, rows: list[dict[str, Any]]) -> list[str]:
    """node-NODE.png for each node with records: the bytes its drives read and wrote at each
    step, beside its ranks' model of a steady step (dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for r in rows:
        steps = r.get("steps") or []
        if not steps:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        xs = range(len(steps))
        for k, (op, colour) in enumerate((("read", "#0072B2"), ("write", "#E69F00"))):
            ax.bar(
                [x + (k - 0.5) * 0.38 for x in xs],
                [s[f"{op}_bytes"] / GIB for s in steps],
                width=0.38,
                color=colour,
                label=f"{op}, measured",
            )
            model = (r.get("steady_model") or {}).get(f"{op}_bytes")
            if model is not None:
                ax.axhline(model / GIB, color=colour, linestyle="--", linewidth=1.2,
                           label=f"{op}, model of a steady step")  # fmt: skip
        ax.set_xticks(list(xs), [s["label"].replace("step:", "step ") for s in steps])
        ax.set_ylabel("GiB")
        who = r["node"] + (f" ({r['hostname']})" if r.get("hostname") else "")
        ax.set_title(
            f"node {who}: {r.get('ranks')} rank(s), drives {', '.join(r.get('drives') or [])}"
        )
        # below the axes: the bars reach the model's line
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
        fig.tight_layout()
        name = f"node-{r['node']}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(name)
    return names


def print_nodes(con: Any, doc: dict[str, Any]) -> None:
    """The run's table: a row per node, measured beside its ranks' model."""
    from rich.table import Table

    from iotune.units import binary_size

    t = Table(title=f"{doc['preset']} on {doc['nodes']} nodes ({doc['world']} ranks), {doc['out']}")
    focus = next((r["focus_size"] for r in doc["per_node"] if r.get("focus_size")), None)
    for head in ("node", "host", "ranks", "drives", "step", "read GiB", "model", "write GiB",
                 "model", binary_size(focus) if focus else "focus", "other", "step s", "opt s",
                 "status"):  # fmt: skip
        t.add_column(
            head, justify="left" if head in ("node", "host", "drives", "step") else "right"
        )

    def gib(v: Any) -> str:
        return "" if v is None else f"{v / GIB:.4f}"

    for r in doc["per_node"]:
        m, e = r.get("measured") or {}, r.get("model") or {}
        focus = [m.get("read_focus"), m.get("write_focus")]
        other = [m.get("read_other"), m.get("write_other")]
        t.add_row(
            r["node"],
            r.get("hostname") or "",
            str(r.get("ranks") or ""),
            ", ".join(r.get("drives") or []),
            (r.get("case") or "").split(" (")[0],
            gib(m.get("read_bytes")),
            gib(e.get("read_bytes")),
            gib(m.get("write_bytes")),
            gib(e.get("write_bytes")),
            "" if None in focus else str(sum(focus)),  # type: ignore[arg-type]
            "" if None in other else str(sum(other)),  # type: ignore[arg-type]
            "" if m.get("step_s") is None else f"{m['step_s']:.2f}",
            "" if m.get("optimizer_s") is None else f"{m['optimizer_s']:.2f}",
            "ok" if r["exit_code"] == 0 else f"exit {r['exit_code']}: {r.get('error') or ''}",
        )
    con.print(t)
    if doc.get("figures"):
        con.print(
            f"figures: {', '.join(doc['figures'])}; each node's records under {doc['out']}/NODE"
        )


def argv_here() -> list[str]:
    """This iotune command's arguments, as every node runs them."""
    return sys.argv[1:]
