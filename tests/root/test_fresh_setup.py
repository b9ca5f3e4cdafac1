"""The README's set-up on a host that cannot be warm: a Debian root made from nothing, where no
package, header link, tracefs mount or virtualenv exists before `scripts/setup.sh install` runs.
On this kernel (it has BTF) the set-up installs libbpf for trace, and no LLVM, bcc or headers.
Then `scripts/setup.sh test` in the same root installs what the test tiers use (collecting the
nodes' tests, not running them): what two nodes over ssh and the NVMe-oF target need is there.
The machine that runs CI has run the set-up before, so only a root like this one shows what a
new user's host goes through (tests/tools/fresh_root.sh says what is carried in and why)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.beside_study

TOP = Path(__file__).resolve().parents[2]
#: between the two set-ups' output
TEST_MODE = "=== scripts/setup.sh test ==="


def test_setup_and_doctor_in_an_empty_debian_root(tmp_path: Path, plain_workers: None) -> None:
    p = subprocess.run(
        [
            str(TOP / "tests" / "tools" / "fresh_root.sh"),
            str(TOP),
            str(tmp_path / "fresh"),
            # on a kernel with BTF the set-up installs no LLVM, no headers and no bcc for
            # trace: libbpf's prebuilt CO-RE object serves
            "sh",
            "-c",
            "if dpkg-query -W -f='${db:Status-Abbrev} ${Package}\\n' | grep -E "
            "'^ii +(libllvm|libclang|linux-headers|python3-bpfcc|bpfcc|clang)' >&2; then "
            "echo 'installed for run:' >&2; exit 3; fi; iotune --json doctor --for trace "
            f"> /tmp/doctor.json && echo '{TEST_MODE}' >&2 && "
            "scripts/setup.sh test --collect-only -q tests/root/test_nodes_root.py >&2 && "
            "for t in sshd ssh pdsh nvme ip rdma; do command -v $t >&2 || exit 4; done && "
            "cat /tmp/doctor.json",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=2400,
    )
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
    assert not (tmp_path / "fresh" / "root").exists()  # removed after a success
