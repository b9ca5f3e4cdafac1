"""Several nodes over DeepSpeed's pdsh launcher: every node of the hostfile must take an ssh
login before anything is trained. A second "node" here is a network namespace with an
address and no sshd (connection refused), beside a name that does not resolve."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.root.conftest import iotune

pytestmark = pytest.mark.beside_study

NS, HOST_IF, NODE_IF = "iotune-node1", "iotn-h", "iotn-n"
HOST_ADDR, NODE_ADDR = "10.213.7.1", "10.213.7.2"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def node() -> Iterator[str]:
    """A network namespace reachable from this host at NODE_ADDR, with nothing listening."""
    subprocess.run(["ip", "netns", "del", NS], check=False, capture_output=True)
    _ip("netns", "add", NS)
    try:
        _ip("link", "add", HOST_IF, "type", "veth", "peer", "name", NODE_IF)
        _ip("link", "set", NODE_IF, "netns", NS)
        _ip("addr", "add", f"{HOST_ADDR}/24", "dev", HOST_IF)
        _ip("link", "set", HOST_IF, "up")
        _ip("-n", NS, "addr", "add", f"{NODE_ADDR}/24", "dev", NODE_IF)
        _ip("-n", NS, "link", "set", NODE_IF, "up")
        _ip("-n", NS, "link", "set", "lo", "up")
        yield NODE_ADDR
    finally:
        subprocess.run(["ip", "link", "del", HOST_IF], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", NS], check=False, capture_output=True)


def test_a_node_that_cannot_be_reached_is_named_before_anything_trains(
    node: str, tmp_path: Path
) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{node} slots=1\nnode-b.invalid slots=1\n")
    out = tmp_path / "run"
    p = iotune(
        "run", "tiny_opt_nvme", "--steps", "1", "--hostfile", str(hostfile),
        "--nvme-path", str(tmp_path), "--out", str(out), check=False,
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines[0] == (
        f"iotune: error: node {node}: ssh: connect to host {node} port 22: Connection "
        "refused (and 1 more): DeepSpeed's pdsh launcher logs in to every node of the "
        "hostfile with ssh"
    ), p.stderr
    assert lines[1].startswith("hint: each node needs sshd and this user's key"), p.stderr
    assert len(lines) == 2 and "Traceback" not in p.stderr
    assert not out.exists()
    # the hostfile's own mistakes come first, as one line each
    hostfile.write_text(f"{node} slots=1\n{node} slots=2\n")
    p = iotune("run", "tiny_opt_nvme", "--hostfile", str(hostfile), check=False)
    assert p.returncode == 2 and f"host {node} is listed twice" in p.stderr
    hostfile.write_text(f"{node}\n")
    p = iotune("run", "tiny_opt_nvme", "--hostfile", str(hostfile), check=False)
    assert p.returncode == 2 and "is not 'HOST slots=N'" in p.stderr
