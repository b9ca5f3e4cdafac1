"""vm tier: one QEMU guest per test session with emulated NVMe drives, real kernel, real md.

Drives (serial → state after set-up):
  IOT0 blank · IOT1 ext4 holding keep.txt (formatted on the host) · IOT2 member of
  /dev/md/held (RAID1) · IOT3 ext4 mounted at /tmp/iot3 · IOT4, IOT5 blank (128 MiB)
  IOT6..IOT9 blank (256 MiB, for the raid tests) · IOT10 a stale ext4 signature (256 MiB)
Tests that build arrays leave their drives blank again.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.vm.guest import Drive, Guest

KEEP = "these bytes must survive every refusal\n"
DRIVES = [
    Drive("IOT0"),
    Drive("IOT1", prepare="ext4", files=(("keep.txt", KEEP),)),
    Drive("IOT2"),
    Drive("IOT3", prepare="ext4"),
    Drive("IOT4"),
    Drive("IOT5"),
    *(Drive(f"IOT{i}", size_mib=256) for i in range(6, 10)),
    Drive("IOT10", size_mib=256, prepare="ext4"),
]
BLANK = ("IOT0", "IOT4", "IOT5", "IOT6", "IOT7", "IOT8", "IOT9")


#: the test modules whose set-up started early (``start_early``), to stop at the session's end
_early: list[Any] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    """A selected vm module with a ``start_early`` gets it called now, so that its set-up's
    unmeasured emulated minutes (a guest's boot and imports) overlap the tests before it."""
    if session.config.option.collectonly:
        return
    for item in session.items:
        module: Any = getattr(item, "module", None)
        if hasattr(module, "start_early") and module not in _early:
            _early.append(module)
            module.start_early()


def pytest_sessionfinish(session: pytest.Session) -> None:
    for module in _early:
        module.stop_early()


class Session:
    def __init__(self, guest: Guest) -> None:
        self.guest = guest
        self.names = guest.by_serial()

    def dev(self, serial: str) -> str:
        return f"/dev/{self.names[serial]}"

    def iotune_json(self, *args: str) -> Any:
        r = self.guest.iotune("--json", *args).check()
        return json.loads(r.stdout)


@pytest.fixture(scope="session")
def vm() -> Iterator[Session]:
    if os.geteuid() != 0:
        pytest.fail("the vm tier needs root (QEMU, loop images): run 'sudo scripts/setup.sh test'")
    workdir = Path(tempfile.mkdtemp(prefix="iotune-vm-"))
    guest = Guest(workdir, DRIVES)
    guest.start()
    try:
        guest.run(
            ["modprobe", "-a", "nvme", "md_mod", "raid0", "raid1", "raid456", "raid10"]
        ).check()
        s = Session(guest)
        guest.run(
            [
                "mdadm",
                "--create",
                "/dev/md/held",
                "--level=1",
                "--raid-devices=2",
                "--metadata=1.2",
                "--run",
                "--force",
                s.dev("IOT2"),
                "missing",
            ]
        ).check()
        guest.run(["mkdir", "-p", "/tmp/iot3"]).check()
        guest.run(["mount", s.dev("IOT3"), "/tmp/iot3"]).check()
        yield s
    finally:
        guest.stop()
