"""The RAID0 study's lab: a guest of its own (QEMU TCG) with seven NVMe drives throttled
to the same bandwidth, a single drive, a RAID0 of 2 and a RAID0 of 4 built with `iotune raid
create`, and a zygote that has imported torch, DeepSpeed and transformers once, for every
training and AIO worker to fork from. Used by tests/vm/test_study_vm.py through the ``lab``
fixture (tests/vm/conftest.py), which brings it up early."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from threading import Event
from typing import Any

from tests.vm import guest_ops
from tests.vm.guest import Drive, Guest, Result

MIB = 2**20
#: each drive's bandwidth, reads and writes together (QEMU's throttling.bps-total)
BPS = 2 * MIB
VOLUMES = {"single": ("ST0",), "raid0x2": ("ST1", "ST2"), "raid0x4": ("ST3", "ST4", "ST5", "ST6")}
DRIVES = [Drive(s, size_mib=2048, bps=BPS) for members in VOLUMES.values() for s in members]
ZYGOTE = "/tmp/iotune-zygote.sock"
BIN = Path(sys.executable).parent


@dataclass
class Lab:
    guest: Guest
    env: dict[str, str]
    names: dict[str, str] = field(default_factory=dict)

    @property
    def share(self) -> Path:
        return self.guest.share

    def iotune(self, *args: str, timeout: float = 600.0) -> Result:
        return self.guest.run([str(BIN / "iotune"), *args], timeout=timeout, env=self.env)

    def iotune_json(self, *args: str, timeout: float = 600.0) -> Any:
        return json.loads(self.iotune("--json", *args, timeout=timeout).check().stdout)


def wait_for(log: Path, text: str, seconds: float, cancel: Event | None = None) -> None:
    deadline = time.monotonic() + seconds
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        if cancel is not None and cancel.is_set():
            raise RuntimeError(f"stopped while waiting for {text!r} in {log}")
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise TimeoutError(f"{text!r} not in {log} after {seconds:.0f} s:\n{tail}")
        time.sleep(1)


def bring_up(guests: list[Guest], cancel: Event, environ: dict[str, str]) -> Lab:
    """The guest booted, the zygote's import done, the three volumes built: minutes of
    emulated CPU that measure nothing. The guest goes into *guests* as soon as it exists,
    for whoever stops it; *cancel* set ends the bring-up at its next stage; the ops' build
    and the guest start in *environ*."""

    def go_on() -> None:
        if cancel.is_set():
            raise RuntimeError("the study's lab was stopped while it came up")

    top = guest_ops.default_dir()
    env = {**guest_ops.build(top, environ), "IOTUNE_ZYGOTE": ZYGOTE}
    go_on()
    workdir = Path(tempfile.mkdtemp(prefix="iotune-study-vm-"))
    guest = Guest(
        workdir,
        DRIVES,
        memory="4G",
        qemu_opts=("-accel", "tcg,thread=multi,tb-size=1024"),
        rwdirs=(top,),
        environ=environ,
    )
    guests.append(guest)
    guest.start(timeout=600)
    go_on()
    lab = Lab(guest, env)
    # the zygote imports torch, DeepSpeed and transformers once (minutes of emulated
    # CPU); every training and AIO worker forks from it. The volumes are built meanwhile.
    log = guest.share / "zygote.log"
    guest.spawn([sys.executable, "-m", "iotune.workers.zygote", "serve", ZYGOTE], log, env)
    guest.run(["modprobe", "-a", "nvme", "md_mod", "raid0"]).check()
    lab.names = guest.by_serial()
    for name, members in VOLUMES.items():
        go_on()
        devs = [f"/dev/{lab.names[s]}" for s in members]
        if len(devs) == 1:
            guest.run(["mkfs.xfs", "-q", "-f", "-L", name, *devs]).check()
            guest.run(["mkdir", "-p", f"/tmp/{name}"]).check()
            guest.run(["mount", "-o", "noatime", *devs, f"/tmp/{name}"]).check()
            continue
        doc = lab.iotune_json(
            "raid", "create", *devs, "--name", name, "--mount", f"/tmp/{name}", "--yes"
        )
        assert doc["applied"] is True and doc["array"]["level"] == "raid0", doc
    wait_for(log, "imported in", 1200, cancel)
    return lab
