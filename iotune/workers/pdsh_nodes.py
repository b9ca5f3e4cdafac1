"""Worker: DeepSpeed's runner (deepspeed.launcher.runner) over pdsh, with iotune's node entry
on every node in place of deepspeed.launcher.launch.

    python -m iotune.workers.pdsh_nodes [DEEPSPEED RUNNER ARGS] --module iotune.workers.train PAYLOAD

DeepSpeed's PDSH runner builds the one command pdsh runs on each node (``cd CWD; python -u -m
deepspeed.launcher.launch --world_info=... --node_rank=%n ...``) and the ``pkill -f`` that stops
it. Here both name ``iotune.workers.node`` instead, which runs the same iotune command on its
node with --node-rank, each node tracing its own drives (iotune.train.nodes); everything else
is DeepSpeed's: the world, the ranks' addresses, the exported variables, pdsh's fan-out.
"""

from __future__ import annotations

import sys
from typing import Any

LAUNCH = "deepspeed.launcher.launch"
ENTRY = "iotune.workers.node"


def swap_launch(cmd: list[str]) -> list[str]:
    """The pdsh command with iotune's node entry where DeepSpeed's launch was. Pure."""
    out = list(cmd)
    for i in range(len(out) - 1):
        if out[i] == "-m" and out[i + 1] == LAUNCH:
            out[i + 1] = ENTRY
            return out
    raise RuntimeError(f"DeepSpeed's pdsh command does not run {LAUNCH}: {cmd}")


def swap_kill(kill: list[str]) -> list[str]:
    """The pdsh ``pkill -f`` that stops the node entries instead of DeepSpeed's launch (its
    pattern ends in the module's name, less its last letter). Pure."""
    stem = LAUNCH[:-1]
    return [a[: a.index(stem)] + ENTRY if stem in a else a for a in kill]


def main() -> None:
    from deepspeed.launcher import runner
    from deepspeed.launcher.multinode_runner import PDSHRunner

    original = PDSHRunner.get_cmd

    def get_cmd(self: Any, environment: dict[str, str], active: Any) -> Any:
        cmd, kill, env = original(self, environment, active)
        return swap_launch(cmd), swap_kill(kill), env

    PDSHRunner.get_cmd = get_cmd  # type: ignore[method-assign]
    runner.main(sys.argv[1:])


if __name__ == "__main__":
    main()
