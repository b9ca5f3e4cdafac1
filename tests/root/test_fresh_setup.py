"""The README's set-up on a host that cannot be warm: a Debian root made from nothing, where no
package, header link, tracefs mount or virtualenv exists before `scripts/setup.sh install` runs.
On this kernel (it has BTF) the set-up installs libbpf for trace, and no LLVM, bcc or headers.
Then `scripts/setup.sh test` in the same root installs what the test tiers use (collecting the
nodes' tests, not running them): what two nodes over ssh and the NVMe-oF target need is there.
The machine that runs CI has run the set-up before, so only a root like this one shows what a
new user's host goes through (tests/tools/fresh_root.sh says what is carried in and why)."""

from __future__ import annotations

import json

import pytest

from tests import background
from tests.background import TEST_MODE

pytestmark = pytest.mark.beside_study


@pytest.mark.background("fresh_root")
def test_setup_and_doctor_in_an_empty_debian_root() -> None:
    # tests/background.py holds the command; it starts with the first test beside the study
    p = background.result("fresh_root")
    assert p.work is not None
    tail = p.stderr[-4000:]
    assert p.returncode == 0, f"exit {p.returncode}\n{tail}\n{p.stdout[-2000:]}"
    # (the command line, echoed first, names the marker too: the last one divides them)
    install, _, test = p.stderr.rpartition(TEST_MODE)
    assert "as the headers of kernel" not in install, tail
    assert "linked the system bcc module" not in install, tail
    assert "setup: mounted tracefs at /sys/kernel/tracing" in install, tail
    assert "setup: creating virtualenv /src/.venv" in install, tail
    # test mode: its packages (what is missing after install), the nodes' tests collected,
    # and every program the nodes' and the fabrics' tests run found on PATH
    installing = next(x for x in test.splitlines() if x.startswith("setup: installing: "))
    for pkg in ("openssh-server", "pdsh", "nvme-cli", "iproute2", "qemu-system-x86"):
        assert pkg in installing.split(), installing
    assert "test_two_nodes_over_ssh" in test, test[-2000:]
    for tool in ("sshd", "pdsh", "nvme", "rdma"):
        assert f"/{tool}\n" in test, test[-2000:]
    doc = json.loads(p.stdout)
    assert doc["ready"]["trace"] is True, doc["missing"]
    checks = {c["name"]: c for c in doc["checks"]}
    # doctor loaded the CO-RE object through libbpf and attached its programs; bcc's chain
    # is not there and not needed
    assert checks["libbpf load"]["status"] == "PASS", checks["libbpf load"]
    assert checks["tracer"]["found"].startswith("trace uses libbpf"), checks["tracer"]
    assert checks["bcc"]["status"] == "WARN", checks["bcc"]
    assert checks["kernel headers"]["status"] == "WARN", checks["kernel headers"]
    assert not (p.work / "fresh" / "root").exists()  # removed after a success
