"""The README's set-up on a host that cannot be warm: a Debian root made from nothing, where no
package, header link, tracefs mount or virtualenv exists before `scripts/setup.sh install` runs.
On this kernel (it has BTF) the set-up installs libbpf for trace, and no LLVM, bcc or headers.
The machine that runs CI has run the set-up before, so only a root like this one shows what a
new user's host goes through (tests/tools/fresh_root.sh says what is carried in and why)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.beside_study

TOP = Path(__file__).resolve().parents[2]


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
            "echo 'installed for run:' >&2; exit 3; fi; exec iotune --json doctor --for trace",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=2400,
    )
    tail = p.stderr[-4000:]
    assert p.returncode == 0, f"exit {p.returncode}\n{tail}\n{p.stdout[-2000:]}"
    assert "as the headers of kernel" not in p.stderr, tail
    assert "linked the system bcc module" not in p.stderr, tail
    assert "setup: mounted tracefs at /sys/kernel/tracing" in p.stderr, tail
    assert "setup: creating virtualenv /src/.venv" in p.stderr, tail
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
