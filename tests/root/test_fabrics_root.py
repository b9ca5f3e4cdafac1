"""`iotune fabrics connect` on this host's own kernel: a transport whose host module the
kernel lacks is named, with the kernel option that builds it, before nvme-cli is asked; a
kernel that has it goes on to a target that does not answer. (The vm tier connects a real
target: tests/vm/test_fabrics_vm.py.)"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.root.conftest import iotune

pytestmark = pytest.mark.beside_study

CONFIG = {"tcp": "CONFIG_NVME_TCP", "rdma": "CONFIG_NVME_RDMA"}


def _loadable(module: str) -> bool:
    if Path(f"/sys/module/{module.replace('-', '_')}").exists():
        return True
    dry = subprocess.run(["modprobe", "-n", module], capture_output=True, text=True, check=False)
    return dry.returncode == 0


def _closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("transport", ["tcp", "rdma"])
def test_a_transport_the_kernel_lacks_is_named_before_anything_connects(transport: str) -> None:
    port = _closed_port()
    p = iotune(
        "fabrics", "connect", f"{transport}://127.0.0.1:{port}", "--nqn", "nqn.x", check=False
    )
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("hint: "), p.stderr
    module = f"nvme-{transport}"
    if not _loadable(module):
        assert lines[0].startswith(
            f"iotune: error: the kernel has no {module} module, which the {transport} "
            f"transport needs (modprobe: "
        ), lines
        assert CONFIG[transport] in lines[1], lines
    elif transport == "tcp":
        assert lines[0] == (
            f"iotune: error: tcp://127.0.0.1:{port} does not answer (connection refused: "
            "nothing listens there)"
        ), lines
    else:  # RDMA has no port to knock on: the discovery through nvme-cli fails
        assert lines[0].startswith(
            f"iotune: error: the discovery at rdma://127.0.0.1:{port} failed: "
        ), lines
