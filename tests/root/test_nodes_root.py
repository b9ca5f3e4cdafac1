"""Several nodes over DeepSpeed's pdsh launcher. Two real nodes on this host: each a network
namespace on a bridge with its own address, sshd, hostname (and /etc/hosts naming it), its
own mount namespace with its own loop-device volume at the offload path and its own run
directory (a tmpfs), so nothing is shared but the installed software, as on two machines.
DeepSpeed's runner logs in to both with pdsh over ssh; each node traces its own drive; the
ranks talk over TCP (gloo); this host gathers the records over ssh. And every node of the
hostfile must take an ssh login before anything is trained: a node with an address and no
sshd (connection refused), beside a name that does not resolve."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


BRIDGE, NET = "iotn-br", "10.213.8"
#: what writes move beyond DeepSpeed's files: ext4's journal commits and metadata blocks
FS_WRITES = 256 * 1024
SSHD = """Port 22
ListenAddress {addr}
HostKey {key}
PidFile none
AuthorizedKeysFile {authorized}
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
"""
#: in the node's own mount and UTS namespaces: its hostname, resolvable (gloo binds the
#: address its hostname resolves to), tracefs (lost with the netns's fresh sysfs), its
#: volume, its own run directory; then sshd
START = (
    "set -e; hostname $0; mount --bind $1 /etc/hosts; "
    "mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing; "
    "mount $2 $3; mount -t tmpfs tmpfs $4; exec /usr/sbin/sshd -D -e -f $5"
)


@dataclass
class Nodes:
    addrs: list[str]
    names: list[str]  # hostnames
    drives: list[str]  # each node's loop device
    vol: Path  # the offload path: each node's own volume there
    out: Path  # the run directory: each node's own tmpfs there
    hostfile: Path
    env: dict[str, str]  # pdsh's (and iotune's) ssh options: the key, the known hosts
    sshd: list[int]  # each node's sshd, in its namespaces


def _sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def two_nodes(loop_device: Callable[..., str], tmp_path: Path) -> Iterator[Nodes]:
    for k in ("client", "host"):
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / k))
    (tmp_path / "authorized_keys").write_text((tmp_path / "client.pub").read_text())
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation
    vol, out = tmp_path / "vol", tmp_path / "run"
    vol.mkdir()
    out.mkdir()
    nodes = Nodes([], [], [], vol, out, tmp_path / "hostfile", {}, [])
    daemons: list[subprocess.Popen[bytes]] = []
    subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
    try:
        _sh("ip", "link", "add", BRIDGE, "type", "bridge")
        _sh("ip", "addr", "add", f"{NET}.1/24", "dev", BRIDGE)
        _sh("ip", "link", "set", BRIDGE, "up")
        for i, x in enumerate("ab"):
            ns, addr, name = f"iotune-node-{x}", f"{NET}.{i + 2}", f"node-{x}"
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
            _sh("ip", "netns", "add", ns)
            _sh("ip", "link", "add", f"iotn-{x}", "type", "veth", "peer", "name", "eth0",
                "netns", ns)  # fmt: skip
            _sh("ip", "link", "set", f"iotn-{x}", "master", BRIDGE, "up")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
            dev = loop_device(size_mib=1024, fs="ext4")
            Path(f"/sys/block/{Path(dev).name}/queue/max_sectors_kb").write_text("512")
            # every node's name, as a cluster's hosts file (or DNS) has them
            hosts = tmp_path / f"hosts-{x}"
            hosts.write_text(f"127.0.0.1 localhost\n{NET}.2 node-a\n{NET}.3 node-b\n")
            cfg = tmp_path / f"sshd-{x}"
            cfg.write_text(
                SSHD.format(
                    addr=addr, key=tmp_path / "host", authorized=tmp_path / "authorized_keys"
                )
            )
            argv = ["ip", "netns", "exec", ns, "unshare", "--mount", "--uts"]
            argv += ["--propagation", "private", "sh", "-c", START, name, str(hosts), dev]
            argv += [str(vol), str(out), str(cfg)]
            log = (tmp_path / f"sshd-{x}.log").open("wb")
            daemons.append(subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True))
            nodes.sshd.append(daemons[-1].pid)
            nodes.addrs.append(addr)
            nodes.names.append(name)
            nodes.drives.append(Path(dev).name)
        for addr, d in zip(nodes.addrs, daemons, strict=True):
            deadline = time.monotonic() + 30
            while True:
                assert d.poll() is None, (tmp_path / "sshd-a.log").read_text()
                try:
                    socket.create_connection((addr, 22), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"no sshd at {addr}"
                    time.sleep(0.2)
        nodes.hostfile.write_text("".join(f"{a} slots=1\n" for a in nodes.addrs))
        nodes.env = {
            "PDSH_SSH_ARGS_APPEND": f"-i {tmp_path / 'client'} "
            f"-o UserKnownHostsFile={tmp_path / 'known_hosts'} -o LogLevel=ERROR"
        }
        yield nodes
    finally:
        for d in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(d.pid, signal.SIGKILL)
            d.wait()
        # anything a login left behind in a node's namespaces (their mounts go with them)
        for x in "ab":
            pids = subprocess.run(["ip", "netns", "pids", f"iotune-node-{x}"],
                                  capture_output=True, text=True, check=False).stdout.split()  # fmt: skip
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", f"iotune-node-{x}"], check=False)
        subprocess.run(["ip", "link", "del", BRIDGE], check=False, capture_output=True)
        time.sleep(0.5)  # the namespaces' mounts released before the loop devices go


def test_two_nodes_over_ssh_each_trace_their_own_drive_and_move_their_ranks_model(
    two_nodes: Nodes,
) -> None:
    n = two_nodes
    p = iotune(
        "--json", "trace", "--run", "tiny_opt_nvme", "--steps", "2",
        "--hostfile", str(n.hostfile), "--nvme-path", str(n.vol), "--out", str(n.out),
        env=n.env,
    )  # fmt: skip
    doc = json.loads(p.stdout)
    assert (doc["nodes"], doc["world"], doc["exit_code"]) == (2, 2, 0), p.stderr
    assert doc["launcher"] == "pdsh" and doc["master_addr"] == n.addrs[0]
    # each node's lines reach this one through pdsh, prefixed with the node's name
    for addr in n.addrs:
        assert f"{addr}: iotune: step 2/2" in p.stderr, p.stderr
    rows = doc["per_node"]
    assert [r["node"] for r in rows] == n.addrs
    for rank, (r, name, drive) in enumerate(zip(rows, n.names, n.drives, strict=True)):
        assert r["hostname"] == name and r["exit_code"] == 0, r
        assert (r["ranks"], r["world"], r["steps_done"]) == (1, 2, 2)
        # its own drive, traced by its own tracer (libbpf): no other node's
        assert r["drives"] == [drive] and r["backend"] == "libbpf", r
        m, model = r["measured"], r["model"]
        assert r["case"].startswith("steady"), r
        # its ranks' model: half of the two-rank world's optimizer state
        assert m["read_bytes"] == model["read_bytes"] > 0, r
        assert 0 <= m["write_bytes"] - model["write_bytes"] <= FS_WRITES, r
        assert m["read_focus"] > 0 and m["write_focus"] > 0
        assert r["footprint"]["allocated"] == pytest.approx(r["footprint"]["estimate"], rel=0.01)
        # gathered over ssh from the node's own run directory (this host saw none of it)
        here = n.out / r["node"]
        run = json.loads((here / "run.json").read_text())
        assert run["node"] == r["node"] and run["drives"] == [drive]
        events = [json.loads(x) for x in (here / "steps.jsonl").read_text().splitlines()]
        assert {e["rank"] for e in events} == {rank}
        assert {e["world_size"] for e in events if e["event"] == "ready"} == {2}
        assert (n.out / f"node-{r['node']}.png").stat().st_size > 10_000
    assert doc["figures"] == [f"node-{a}.png" for a in n.addrs]
    assert json.loads((n.out / "nodes.json").read_text())["per_node"] == rows
    # the two halves of the world are one model: the same steady step on each node
    assert rows[0]["model"] == rows[1]["model"]

    # a node that fails stops the other, whose rank would wait for it: here the second
    # node has no offload directory (the first has), and the run directory is shared
    (n.vol / "only-a").mkdir()
    _sh("nsenter", "-t", str(n.sshd[0]), "-m", "mkdir", str(n.vol / "only-a"))
    shared = n.out.parent / "shared-run"
    p = iotune(
        "run", "tiny_opt_nvme", "--steps", "2", "--hostfile", str(n.hostfile),
        "--nvme-path", str(n.vol / "only-a"), "--out", str(shared), env=n.env, check=False,
    )  # fmt: skip
    lines = [x for x in p.stderr.splitlines() if x.startswith(("iotune: error:", "hint:"))]
    assert p.returncode == 1 and lines[-2:] == [
        f"iotune: error: node {n.addrs[1]} failed (exit 2): offload directory "
        f"{n.vol / 'only-a'} does not exist",
        "hint: mount an NVMe filesystem there ('iotune raid create --mount'), or pass "
        "--nvme-path DIR",
    ], p.stderr[-3000:]
    doc = json.loads((shared / "nodes.json").read_text())
    a, b = doc["per_node"]
    assert doc["first_failed"] == n.addrs[1] and b["exit_code"] == 2
    # stopped, not failed: 143, or no record where DeepSpeed's pkill came while its entry's
    # interpreter was still starting
    assert a["exit_code"] in (143, None), a
    assert "Traceback" not in p.stderr


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
