"""The README's set-up on a host that cannot be warm: a Debian root made from nothing, where no
package, header link, tracefs mount or virtualenv exists before `scripts/setup.sh install` runs.
The machine that runs CI has run the set-up before, so only a root like this one shows what a
new user's host goes through (tests/tools/fresh_root.sh says what is carried in and why)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]


def test_setup_and_doctor_in_an_empty_debian_root(tmp_path: Path) -> None:
    p = subprocess.run(
        [
            str(TOP / "tests" / "tools" / "fresh_root.sh"),
            str(TOP),
            str(tmp_path / "fresh"),
            *("iotune", "--json", "doctor", "--for", "trace"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=2400,
    )
    tail = p.stderr[-4000:]
    assert p.returncode == 0, f"exit {p.returncode}\n{tail}\n{p.stdout[-2000:]}"
    release = os.uname().release
    if not Path(f"/usr/src/linux-headers-{release}").exists():
        # this kernel has no headers package of its own: the set-up linked the generic ones
        assert f"as the headers of kernel {release}" in p.stderr, tail
    assert "setup: mounted tracefs at /sys/kernel/tracing" in p.stderr, tail
    assert "setup: creating virtualenv /src/.venv" in p.stderr, tail
    doc = json.loads(p.stdout)
    assert doc["ready"]["trace"] is True, doc["missing"]
    checks = {c["name"]: c for c in doc["checks"]}
    # doctor compiled, loaded and attached a real BPF program against those headers
    assert checks["BPF load"]["status"] == "PASS", checks["BPF load"]
    assert checks["kernel headers"]["status"] == "PASS", checks["kernel headers"]
    assert not (tmp_path / "fresh" / "root").exists()  # removed after a success
