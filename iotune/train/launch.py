"""Several ranks, or several nodes: the command line for DeepSpeed's own launcher. Pure,
apart from reading a hostfile and picking a free port.

One rank runs the training worker directly. More ranks on this node run
``deepspeed --num_gpus N`` (``--include localhost:...`` where CUDA_VISIBLE_DEVICES narrows
the GPUs), with DS_ACCELERATOR=cpu on a CPU host (gloo). A hostfile passes to DeepSpeed's
multi-node runner: over ssh (pdsh, or ``--launcher`` openmpi, mpich, slurm, ...) from this
node, or, with ``--node-rank``, without ssh: the same iotune command on every node, each
starting its own ranks and tracing its own drives (deepspeed's ``--no_ssh --node_rank``).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from iotune.errors import UsageError
from iotune.proc import module_args, zygote_socket
from iotune.workers.launch import LOCAL_LAUNCH

LAUNCHERS = ("pdsh", "openmpi", "mvapich", "mpich", "impi", "slurm")


@dataclass(frozen=True)
class Launch:
    ranks: int  # ranks on this node
    hosts: tuple[tuple[str, int], ...] = ()  # the hostfile: (host, slots) in its order
    hostfile: str | None = None
    node_rank: int | None = None  # without ssh: this node's place in the hostfile
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "pdsh"

    @property
    def nodes(self) -> int:
        return max(1, len(self.hosts))

    @property
    def node(self) -> str | None:
        """This node's name in the hostfile (the first host when launching over ssh)."""
        if not self.hosts:
            return None
        return self.hosts[self.node_rank or 0][0]

    @property
    def over_pdsh(self) -> bool:
        """Several nodes started from this one by DeepSpeed's pdsh launcher (over ssh)."""
        return bool(self.hosts) and self.node_rank is None and self.launcher == "pdsh"

    @property
    def world(self) -> int:
        return sum(s for _, s in self.hosts) if self.hosts else self.ranks


def read_hostfile(path: Path) -> tuple[tuple[str, int], ...]:
    """DeepSpeed's hostfile: one ``HOST slots=N`` per line, ``#`` comments
    (launcher/runner.py _parse_hostfile)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(
            f"cannot read hostfile {path}: {exc.strerror}",
            hint="one line per node: HOSTNAME slots=GPUS",
        ) from exc
    hosts: list[tuple[str, int]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = parts[1].removeprefix("slots=") if len(parts) == 2 else ""
        if len(parts) != 2 or not parts[1].startswith("slots=") or not slots.isdigit():
            raise UsageError(
                f"{path}:{n}: {raw.strip()!r} is not 'HOST slots=N'",
                hint="one line per node: HOSTNAME slots=GPUS",
            )
        if any(h == parts[0] for h, _ in hosts):
            raise UsageError(f"{path}:{n}: host {parts[0]} is listed twice", hint="once per node")
        if int(slots) < 1:
            raise UsageError(f"{path}:{n}: slots must be at least 1", hint=f"{parts[0]} slots=1")
        hosts.append((parts[0], int(slots)))
    if not hosts:
        raise UsageError(f"hostfile {path} names no host", hint="HOSTNAME slots=GPUS per line")
    return tuple(hosts)


def plan_launch(
    ranks: int | None,
    hostfile: str | None,
    node_rank: int | None,
    master_addr: str | None,
    launcher: str | None,
) -> Launch | None:
    """The launch the options ask for; None for one rank on this node (no launcher)."""
    if hostfile is None:
        for opt, val in (("--node-rank", node_rank), ("--master-addr", master_addr)):
            if val is not None:
                raise UsageError(f"{opt} needs --hostfile", hint="--hostfile FILE --node-rank R")
        if launcher is not None:
            raise UsageError("--launcher needs --hostfile", hint="--hostfile FILE --launcher pdsh")
        n = ranks or 1
        return Launch(ranks=n) if n > 1 else None
    hosts = read_hostfile(Path(hostfile))
    if node_rank is not None and not 0 <= node_rank < len(hosts):
        raise UsageError(
            f"--node-rank {node_rank} is not a node of {hostfile} ({len(hosts)} listed)",
            hint=f"0 to {len(hosts) - 1}, this node's line in the hostfile",
        )
    if node_rank is not None and launcher is not None:
        raise UsageError(
            "--launcher and --node-rank exclude each other",
            hint="--node-rank runs this node's ranks without ssh; --launcher starts every node",
        )
    mine = hosts[node_rank or 0][1]
    if ranks is not None and ranks != mine:
        raise UsageError(
            f"--ranks {ranks} but {hostfile} gives this node {mine} slots",
            hint="leave --ranks out with --hostfile: the slots say how many",
        )
    return Launch(
        ranks=mine,
        hosts=hosts,
        hostfile=str(Path(hostfile).resolve()),
        node_rank=node_rank,
        # the hostfile's first node, by the name this node reaches it by (DeepSpeed's own
        # default asks that node's `hostname -I` over plain ssh)
        master_addr=master_addr or hosts[0][0],
        launcher=launcher or "pdsh",
    )


def ssh_command(host: str, *command: str) -> list[str]:
    """ssh to *host* as pdsh's ssh module does it, with the options a user gives pdsh in
    PDSH_SSH_ARGS_APPEND (an identity, a port, a known-hosts file), without a password."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]
    argv += ["-o", "StrictHostKeyChecking=accept-new"]
    argv += shlex.split(os.environ.get("PDSH_SSH_ARGS_APPEND", ""))
    return [*argv, host, *command]


def node_problems(hosts: tuple[tuple[str, int], ...], timeout_s: float = 20.0) -> list[str]:
    """Each node of the hostfile that DeepSpeed's pdsh launcher could not log in to, with
    ssh's own reason ("Connection refused": no sshd; "Could not resolve hostname"; a key
    that is not accepted), asked as pdsh will ask: ``ssh -o BatchMode=yes HOST true``."""
    from iotune import proc
    from iotune.errors import CommandTimeout, last_line

    out = []
    for host, _ in hosts:
        argv = ssh_command(host, "true")
        try:
            done = proc.run(argv, check=False, timeout=timeout_s)
        except CommandTimeout:
            out.append(f"{host}: no answer from ssh in {timeout_s:g} s")
            continue
        if done.returncode != 0:
            out.append(f"{host}: {last_line(done.stderr) or f'ssh exited {done.returncode}'}")
    return out


def check_nodes(launch: Launch) -> None:
    """Over pdsh (DeepSpeed's default multi-node launcher), every node must take an ssh
    login without a password before anything is trained: the first that does not is named
    with ssh's reason, in one line."""
    from iotune.errors import IotuneError, ToolMissing

    if not launch.hosts or launch.node_rank is not None or launch.launcher != "pdsh":
        return
    import shutil

    if shutil.which("pdsh") is None:
        raise ToolMissing("pdsh", "pdsh")
    problems = node_problems(launch.hosts)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise IotuneError(
            f"node {problems[0]}{more}: DeepSpeed's pdsh launcher logs in to every node "
            "of the hostfile with ssh",
            hint="each node needs sshd and this user's key (ssh -o BatchMode=yes NODE true "
            "must work), or run the same command on each node with --node-rank",
        )


def place(
    paths: list[Path],
    ranks: int,
    path_numa: list[int | None],
    gpu_numa: list[int | None],
) -> tuple[list[Path], str]:
    """Each local rank's offload directory, and how it was chosen. NUMA-local where both
    sides are known: rank r (on GPU r of the visible ones) gets a directory whose drive
    hangs off its GPU's NUMA node, taking turns among several; otherwise round robin, rank r
    the directory r mod their number. Pure."""
    rr = [paths[r % len(paths)] for r in range(ranks)]
    known = (
        len(paths) > 1
        and len(gpu_numa) >= ranks
        and all(n is not None for n in path_numa)
        and all(g is not None for g in gpu_numa[:ranks])
    )
    if not known or len(set(path_numa)) < 2:
        return rr, "round robin"
    out = []
    turn: dict[int | None, int] = {}
    for r in range(ranks):
        local = [p for p, n in zip(paths, path_numa, strict=True) if n == gpu_numa[r]]
        if not local:
            return rr, "round robin"
        k = turn.get(gpu_numa[r], 0)
        turn[gpu_numa[r]] = k + 1
        out.append(local[k % len(local)])
    return out, "numa"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def launch_command(
    launch: Launch, spec: Path | str, accelerator: str, env: dict[str, str] | None = None
) -> list[str]:
    """The command the tracer starts: iotune's wrapper around deepspeed.launcher.runner.
    Over ssh (pdsh) it is what iotune.train.nodes starts, and *spec* is what each node's
    entry gets (iotune.workers.node)."""
    visible_env = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES", "")
    argv = [sys.executable, "-m", "iotune.workers.launch"]
    port = launch.master_port or (29500 if launch.hosts else free_port())
    # each rank forks from a zygote where one serves this node (IOTUNE_ZYGOTE): DeepSpeed's
    # launcher then starts the zygote's client, not an import of torch and DeepSpeed per
    # rank; over ssh the other nodes have no such socket
    over_ssh = bool(launch.hosts) and launch.node_rank is None
    module = ["iotune.workers.train"] if over_ssh else module_args("iotune.workers.train")
    if not launch.hosts:
        visible = [d.strip() for d in visible_env.split(",") if d.strip()]
        if accelerator == "cuda" and visible:
            if len(visible) < launch.ranks:
                raise UsageError(
                    f"--ranks {launch.ranks} but CUDA_VISIBLE_DEVICES names {len(visible)} GPU(s)",
                    hint=f"--ranks {len(visible)}, or widen CUDA_VISIBLE_DEVICES",
                )
            slots = visible[: launch.ranks]
            argv += ["--include", "localhost:" + ",".join(slots)]
        else:
            slots = [str(r) for r in range(launch.ranks)]
            argv += ["--num_gpus", str(launch.ranks)]
        if zygote_socket() and all(s.isdigit() for s in slots):
            return local_launch_command([int(s) for s in slots], port, module, spec)
        # not DeepSpeed's default /job/hostfile, whatever this host has there
        argv += ["--hostfile", os.devnull]
    else:
        argv += ["--hostfile", str(launch.hostfile)]
        if launch.node_rank is not None:
            argv += ["--no_ssh", "--node_rank", str(launch.node_rank)]
        else:
            argv += ["--launcher", launch.launcher]
            if launch.launcher == "pdsh":
                # every node's login was checked as pdsh logs in (check_nodes); DeepSpeed's
                # own check is plain ssh, without PDSH_SSH_ARGS_APPEND
                argv.append("--no_ssh_check")
        if launch.master_addr:
            argv += ["--master_addr", launch.master_addr]
    # DeepSpeed's launcher logs every environment variable it passes on at info level; the
    # command it runs is in the run directory's command.json
    argv += ["--master_port", str(port), "--log_level", "error"]
    argv += ["--no_local_rank", "--module", *module]
    return [*argv, str(spec)]


def world_info(slots: list[int]) -> str:
    """DeepSpeed's ``--world_info`` for ranks on this node only, on devices *slots*: what
    its runner gives its launch (``encode_world_info`` of ``{"localhost": slots}``)."""
    doc = json.dumps({"localhost": slots}).encode()
    return base64.urlsafe_b64encode(doc).decode()


def local_launch_command(
    slots: list[int], port: int, module: list[str], spec: Path | str
) -> list[str]:
    """Ranks on this node where a zygote serves it: the wrapper starts DeepSpeed's launch
    (``deepspeed.launcher.launch``, which starts and stops the ranks) forked from the
    zygote, with the arguments DeepSpeed's runner would give it. The runner itself only
    works those out, in a process of its own that imports torch and DeepSpeed, and so would
    the launch: two imports a run, minutes each in an emulated guest."""
    return [
        sys.executable,
        "-m",
        "iotune.workers.launch",
        LOCAL_LAUNCH,
        f"--world_info={world_info(slots)}",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        "--no_local_rank",
        "--module",
        "--enable_each_rank_log=None",  # the runner's default, passed on as it does
        "--log_level=error",
        *module,
        str(spec),
    ]
