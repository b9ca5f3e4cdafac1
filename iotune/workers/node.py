"""Worker: one node's part of a run over ssh, where DeepSpeed's pdsh launcher would run
deepspeed.launcher.launch (iotune.workers.pdsh_nodes puts it there).

    python -u -m iotune.workers.node --world_info=B64 --node_rank=N --master_addr=A ... PAYLOAD

It runs the iotune command of the run on this node with ``--node-rank N --master-addr A``:
this node's estimate and refusals, its own ranks through DeepSpeed's launcher (``--no_ssh``),
its own drives traced, its records in OUT/HOST. Its stderr passes through (pdsh prefixes each
line with the node's name); its table does not (the run on the first node gathers them).
OUT/HOST/node.json says how it ended: exit code, the last error and hint, the node's hostname.
A SIGTERM (DeepSpeed's ``pkill -f`` of every node when the run is stopped) or a hang-up goes
on to that iotune, which stops its ranks and keeps its records.
"""

from __future__ import annotations

import base64
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

NODE_FILE = "node.json"
#: the node entry's last line on stderr
END = "iotune: node {host} exited {code}"


def encode(payload: dict[str, Any]) -> str:
    """The run's payload as one shell word (pdsh splits arguments on white space). Pure."""
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()


def decode(word: str) -> dict[str, Any]:
    return dict(json.loads(base64.urlsafe_b64decode(word.encode())))


def parse(args: list[str]) -> tuple[str, int, str, dict[str, Any]]:
    """This node's name in the hostfile, its rank, the master's address and the payload
    from deepspeed.launcher.launch's arguments (the payload last). Pure."""
    opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
    world = json.loads(base64.urlsafe_b64decode(opts["world_info"].encode()))
    rank = int(opts["node_rank"])
    return list(world)[rank], rank, opts["master_addr"], decode(args[-1])


def node_command(payload: dict[str, Any], rank: int, master_addr: str) -> list[str]:
    """The iotune command this node runs. Pure."""
    argv = [*payload["argv"], "--node-rank", str(rank), "--master-addr", master_addr]
    return [sys.executable, "-m", "iotune", *argv]


def main() -> int:
    host, rank, master, payload = parse(sys.argv[1:])
    # the signals first: DeepSpeed's pkill may come at once (another node failed), and a
    # signal between starting the node's iotune and catching it would leave that iotune
    # waiting for its world
    stop: list[int] = []
    child: subprocess.Popen[str] | None = None

    def forward(signum: int, frame: object) -> None:
        stop.append(signum)
        if child is not None:
            child.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, forward)
    out = Path(payload["out"]) / host
    if stop:  # stopped before it began
        return _end(out, host, rank, 128 + stop[0], None, None)
    child = subprocess.Popen(
        node_command(payload, rank, master),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if stop:
        child.send_signal(signal.SIGTERM)
    error = hint = None
    for line in child.stderr or ():
        sys.stderr.write(line)
        sys.stderr.flush()
        text = line.rstrip("\n")
        if text.startswith("iotune: error: "):
            error, hint = text.removeprefix("iotune: error: "), None
        elif text.startswith(("iotune: the training worker failed", "iotune: interrupted")):
            error, hint = text.removeprefix("iotune: "), None
        elif text.startswith("hint: "):
            hint = text.removeprefix("hint: ")
    code = child.wait()
    code = code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as in a shell
    return _end(out, host, rank, code, error, hint)


def _end(out: Path, host: str, rank: int, code: int, error: str | None, hint: str | None) -> int:
    """OUT/HOST/node.json, and the last line on stderr; the exit code."""
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "node": host,
        "node_rank": rank,
        "hostname": socket.gethostname(),
        "exit_code": code,
        "error": error if code else None,
        "hint": hint if code else None,
    }
    (out / NODE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    # the last line, for the first node (through pdsh): a node that failed stops the others,
    # whose ranks would otherwise wait for it
    sys.stderr.write(END.format(host=host, code=code) + "\n")
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
