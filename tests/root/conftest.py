"""Root tier: real loop devices, real BPF, real tools on the host. Needs root: without it
every test here fails (never skips), so a CI host that cannot run them is noticed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from iotune.proc import ZYGOTE_ENV

IOTUNE = str(Path(sys.executable).parent / "iotune")
LAZY0 = "lazy_itable_init=0,lazy_journal_init=0"


@pytest.fixture(autouse=True, scope="session")
def _sigint_reaches_the_children() -> None:
    """A tier started in the background by a non-interactive shell ('cmd &') inherits SIGINT
    ignored, and so would every iotune it starts: the Ctrl-C tests would wait forever.
    A handler (unlike SIG_IGN) is reset to the default in an exec'd child."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="package")
def _workers_fork_from_a_zygote(zygote: str) -> Iterator[None]:
    """Every worker of this tier (training, probes, sweep points) forks from the session's
    zygote (tests/conftest.py), which imported torch, DeepSpeed and transformers and loaded
    DeepSpeed's ops once: a worker's imports cost about 6 s here, paid once instead of in
    each of the tier's runs. Tests that need plain workers drop it with the
    ``plain_workers`` fixture or ``env=PLAIN``: the fresh root, those that kill a worker and
    check the worker itself by its command line (a study's, a sweep's, a run's), and the runs
    whose peak RSS is checked against the estimate. The ranks of a multi-rank run on this
    host fork from it too, and so does DeepSpeed's launch that starts them
    (iotune/workers/launch.py)."""
    os.environ[ZYGOTE_ENV] = zygote
    try:
        yield
    finally:
        os.environ.pop(ZYGOTE_ENV, None)


#: ``env=`` for one iotune command whose workers start plainly (an empty socket: no zygote)
PLAIN = {ZYGOTE_ENV: ""}


@pytest.fixture
def plain_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's workers start as ``python -m MODULE``, with their own imports."""
    monkeypatch.delenv(ZYGOTE_ENV)


@pytest.fixture(autouse=True)
def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("the root tier needs root: run 'sudo scripts/setup.sh test'")


def sh(*argv: str, input: str | None = None) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, input=input).stdout


def iotune(
    *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(
        [IOTUNE, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={**os.environ, **env} if env else None,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"iotune {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p


def iotune_json(*args: str) -> Any:
    return json.loads(iotune("--json", *args).stdout)


def interrupt_after_steps(child: subprocess.Popen[str], steps: Path, n: int) -> str:
    """Ctrl-C a training run once *steps* holds n step events (ranks each write their own);
    returns its stderr, after checking it exited like an interrupted program (130)."""
    deadline = time.monotonic() + 300
    while not (steps.exists() and steps.read_text().count('"event": "step"') >= n):
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    child.send_signal(signal.SIGINT)
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 130, stderr
    assert "interrupted (SIGINT) after" in stderr
    return stderr


class LoopDevices:
    """Factory: loop devices over sparse files in *tmp*; close() unmounts and detaches them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.made: list[str] = []
        self.mounts: list[Path] = []

    def __call__(
        self,
        size_mib: int = 64,
        sector_size: int = 512,
        fs: str | None = None,
        mount: bool = False,
        direct_io: bool = False,
    ) -> str:
        """``direct_io``: the loop device reads and writes its file with O_DIRECT, so its
        requests complete from the interrupts of the drive under the file."""
        img = self.tmp / f"disk{len(self.made)}.img"
        with img.open("wb") as fh:
            fh.truncate(size_mib * 2**20)
        dev = sh(
            "losetup",
            "--find",
            "--show",
            f"--sector-size={sector_size}",
            *(["--direct-io=on"] if direct_io else []),
            str(img),
        ).strip()
        self.made.append(dev)
        # queue limits outlive losetup -d: a reused loop device keeps the last test's
        # max_sectors_kb, so start every device at its hardware limit
        queue = Path(f"/sys/block/{Path(dev).name}/queue")
        (queue / "max_sectors_kb").write_text((queue / "max_hw_sectors_kb").read_text())
        if fs:
            if fs == "ext4":
                # no lazy init: ext4lazyinit would zero inode tables in the background
                # (REQ_OP_WRITE_ZEROES, which diskstats counts as writes) during a test
                sh("mkfs.ext4", "-q", "-F", "-E", LAZY0, dev)
            else:
                sh(f"mkfs.{fs}", "-q", "-f", dev)
        if mount:
            mnt = self.tmp / f"mnt{len(self.made)}"
            mnt.mkdir()
            sh("mount", dev, str(mnt))
            self.mounts.append(mnt)
        return dev

    def close(self) -> None:
        for mnt in self.mounts:
            subprocess.run(["umount", str(mnt)], check=False)
        for dev in self.made:
            subprocess.run(["losetup", "-d", dev], check=False)


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """A LoopDevices factory for one test."""
    devs = LoopDevices(tmp_path)
    yield devs
    devs.close()
