"""vm tier: one QEMU guest per test session with emulated NVMe drives, real kernel, real md.

Drives (serial → state after set-up):
  IOT0 blank · IOT1 ext4 holding keep.txt (formatted on the host) · IOT2 member of
  /dev/md/held (RAID1) · IOT3 ext4 mounted at /tmp/iot3 · IOT4, IOT5 blank (128 MiB)
  IOT6..IOT9 blank (256 MiB, for the raid tests) · IOT10 a stale ext4 signature (256 MiB)
  FAB0, FAB1 blank (64 MiB), exported over NVMe/TCP by the fabrics tests; FAB2 over RDMA
  FB0, FB1 blank (512 MiB), exported over NVMe/TCP to the study's lab, the second guest, on
  a virtual network between the two (guest.Link; tests/vm/fabric_lab.py)
Tests that build arrays leave their drives blank again.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from threading import Event, Lock
from typing import Any

import pytest

from tests.vm.checkpoint_lab import CheckpointRuns, checkpoint_summary, run_checkpoints
from tests.vm.fabric_lab import FAB_SERIALS, FabricRuns, fabric_summary, run_fabric
from tests.vm.guest import WAITS, Drive, Early, Guest, Link
from tests.vm.study_lab import (
    STUDY_NICE,
    Lab,
    LabRuns,
    LostMember,
    bring_up,
    lose_a_member,
    plans_of,
    summary,
    sweeps_and_study,
)

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
    # exported by the guest's own NVMe-oF target (tests/vm/test_fabrics_vm.py)
    Drive("FAB0", size_mib=64),
    Drive("FAB1", size_mib=64),
    Drive("FAB2", size_mib=64),  # over NVMe/RDMA (soft-RoCE)
    # exported over the link to the study's lab, the other host (tests/vm/fabric_lab.py)
    *(Drive(s, size_mib=512) for s in FAB_SERIALS),
]
BLANK = ("IOT0", "IOT4", "IOT5", "IOT6", "IOT7", "IOT8", "IOT9")


class Session:
    def __init__(self, guest: Guest) -> None:
        self.guest = guest
        self.names = guest.by_serial()

    def dev(self, serial: str) -> str:
        return f"/dev/{self.names[serial]}"

    def iotune_json(self, *args: str) -> Any:
        r = self.guest.iotune("--json", *args).check()
        return json.loads(r.stdout)


_link_lock = Lock()
_links: list[Link] = []


def link() -> Link:
    """The session's virtual network: the session guest (1) and the study's lab (2). One
    for both: their set-ups ask for it at once from two threads, and a cache alone is not
    enough (functools.cache may call its function in both while mkdtemp releases the GIL:
    each guest then bound a socket of its own folder and sent to the other's folder's, and
    no frame crossed the link)."""
    with _link_lock:
        if not _links:
            _links.append(Link(Path(tempfile.mkdtemp(prefix="iotune-vm-link-"))))
        return _links[0]


def _vm_setup(guests: list[Guest], cancel: Event, environ: dict[str, str]) -> Session:
    workdir = Path(tempfile.mkdtemp(prefix="iotune-vm-"))
    # NVMe-oF namespaces as disks of their own, not multipath heads: on the guest's 6.1 kernel
    # a head's hidden paths carry no device number for the tracer (iotune trace says so).
    # Without hardened usercopy: its check in the guest's 6.1 kernel stops nvmet-tcp's
    # receive of a 512 KiB write (the lab's, tests/vm/fabric_lab.py) with a kernel BUG
    # ("usercopy: Kernel memory ... attempt detected from page alloc", in
    # nvmet_tcp_io_work), and the target hangs; seen here, and the known workaround for it
    # on Debian's 6.1
    guest = Guest(
        workdir,
        DRIVES,
        environ=environ,
        qemu_opts=link().qemu_opts(1),
        append=("nvme_core.multipath=N", "hardened_usercopy=off"),
    )
    guests.append(guest)
    guest.start(timeout=900)  # it may boot beside another guest's emulated import
    if cancel.is_set():
        raise RuntimeError("the vm guest was stopped while it came up")
    link().up(guest, 1)
    guest.run(["modprobe", "-a", "nvme", "md_mod", "raid0", "raid1", "raid456", "raid10"]).check()
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
    return s


#: each guest fixture's set-up, started with the test loop if a selected vm test uses it, so
#: that its boot and imports take what CPU the root and unit tiers leave idle
SETUPS: dict[str, Callable[[list[Guest], Event, dict[str, str]], Any]] = {
    "vm": _vm_setup,
    "lab": lambda guests, cancel, environ: bring_up(guests, cancel, environ, link()),
}
_early: dict[str, Early[Any]] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Before the first test runs: the set-ups of the guest fixtures that selected vm tests
    use start, at the lowest CPU priority until a test takes them (tests/vm/guest.Early):
    beside the root tier's traced runs, whose per-step counts need a tracer that is not
    starved of CPU, they take only what is idle. Not for --collect-only, --setup-plan, a
    collection that failed, or without root, where the fixtures fail on their own."""
    opt = session.config.option
    if opt.collectonly or getattr(opt, "setupplan", False) or os.geteuid() != 0:
        return
    if session.testsfailed and not opt.continue_on_collection_errors:
        return
    wanted = {
        name
        for item in session.items
        if item.nodeid.startswith("tests/vm/")
        for name in getattr(item, "fixturenames", ())
    }
    for name in sorted(wanted & set(SETUPS)):
        _early[name] = _made(SETUPS[name])
    _wanted.update(wanted)
    if wanted & RUN_FIXTURES:
        session.config.pluginmanager.register(_StudyBeside(), "iotune-study-beside")


class _StudyBeside:
    """Starts the study's runs when the first test marked ``beside_study`` (or the first of
    the study's own) begins: they wait on the lab's throttled drives for minutes, with the
    host's CPU mostly idle, which those tests (no step's trace of a multi-rank run, no
    timing checked) take. The lab runs at STUDY_NICE from then on, above them."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        uses = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("beside_study") is not None or uses & RUN_FIXTURES:
            _start_runs()


RUN_FIXTURES = {"lab_runs", "lost_member", "checkpoint_runs", "fabric_runs"}
#: the study's runs on the lab: the sweeps and the study (study_lab.sweeps_and_study), then
#: the checkpoints (checkpoint_lab.run_checkpoints, on CK_OFFLOAD), one after the other on a
#: thread of their own; and beside the checkpoints, once the study is done, each through an
#: agent of the lab's own: the planner's answers (study_lab.plans_of, with the sweeps and the
#: study the value of the fixture lab_runs), and NVMe/TCP under training
#: (fabric_lab.run_fabric) followed by a member lost mid-study (study_lab.lose_a_member),
#: which breaks raid0x2. None of these is timed, and each has drives of its own
RUNS: dict[str, Future[Any]] = {}
#: each of those runs' start and end (time.monotonic), and how long the tests waited on it
RUN_TIMES: dict[str, list[float]] = {}
WAITED: dict[str, float] = {}
#: the fixtures the selected vm tests use (the member lost mid-study runs only if wanted)
_wanted: set[str] = set()


def _start_runs(lost: bool = False) -> None:
    """The study's runs, and the member lost after them if a selected test (or *lost*)
    wants it, on their thread; from the fixture that asks for one first, if the test loop
    did not start them."""
    if RUNS:
        if lost and "lost_member" not in RUNS:
            raise RuntimeError("the study's runs were started without the member lost")
        return
    early = _early.get("lab")
    if early is None or early.stopped:
        early = _early["lab"] = _made(SETUPS["lab"])

    def go_on() -> None:
        if early.cancel.is_set():
            raise RuntimeError("the study's lab was stopped before its runs")

    def study() -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        return sweeps_and_study(early.take(nice=STUDY_NICE), go_on)

    def plans() -> LabRuns:
        done = RUNS["study"].result()
        go_on()
        return plans_of(early.take().beside("plans"), *done)

    def lose() -> LostMember:
        RUNS["study"].result()  # the study first: what fails there fails this too
        go_on()
        return lose_a_member(early.take().beside(), go_on)

    def saves() -> CheckpointRuns:
        RUNS["study"].result()
        go_on()
        return run_checkpoints(early.take(), go_on)

    def fabric() -> FabricRuns:
        RUNS["study"].result()
        go_on()
        # the target: the session guest, the other end of the link
        target: Session = _early["vm"].take()
        backing = [target.dev(s) for s in FAB_SERIALS]
        # beside the checkpoints and the member lost, through an agent of its own: none of
        # them is timed, and they wait on the throttled drives while it uses the CPU
        return run_fabric(early.take().beside(), target.guest, backing, go_on)

    def timed(name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        def go() -> Any:
            RUN_TIMES[name] = [time.monotonic()]
            try:
                return fn()
            finally:
                RUN_TIMES[name].append(time.monotonic())

        return go

    pool = ThreadPoolExecutor(1, "study-runs")  # one thread: in the order submitted
    RUNS["study"] = pool.submit(timed("study", study))
    planner = ThreadPoolExecutor(1, "plans")
    RUNS["lab_runs"] = planner.submit(timed("lab_runs", plans))
    planner.shutdown(wait=False)
    if "checkpoint_runs" in _wanted:
        RUNS["checkpoint_runs"] = pool.submit(timed("checkpoint_runs", saves))
    side = ThreadPoolExecutor(1, "side-runs")
    if "fabric_runs" in _wanted:
        RUNS["fabric_runs"] = side.submit(timed("fabric_runs", fabric))
    if lost or "lost_member" in _wanted:
        RUNS["lost_member"] = side.submit(timed("lost_member", lose))
    side.shutdown(wait=False)
    pool.shutdown(wait=False)


def _result(name: str) -> Any:
    """The run *name*'s value, the seconds the tests waited on it counted."""
    start = time.monotonic()
    try:
        return RUNS[name].result()
    finally:
        WAITED[name] = WAITED.get(name, 0.0) + time.monotonic() - start


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The RAID0 study's steps, measured and predicted, where its runs ended well; and the
    seconds each of the lab's runs took and the tests waited on it."""
    if RUN_TIMES:
        terminalreporter.write_line(
            "vm tier, the lab's runs: "
            + ", ".join(
                f"{name} {t[-1] - t[0]:.0f} s (waited on {WAITED.get(name, 0.0):.0f} s)"
                for name, t in RUN_TIMES.items()
                if len(t) == 2
            )
        )
    if WAITS:
        near = sorted(WAITS, key=lambda w: w[0] / w[1], reverse=True)[:3]
        terminalreporter.write_line(
            f"vm tier, {len(WAITS)} guest commands; nearest their limits: "
            + "; ".join(
                f"{what!r} {s:.0f} s of {lim:.0f} s ({lim / max(s, 1e-3):.0f}x)"
                for s, lim, what in near
            )
        )
    summaries: list[tuple[str, str, Callable[[Any], list[str]]]] = [
        ("fabric_runs", "NVMe/TCP across the link in the vm tier", fabric_summary),
        ("checkpoint_runs", "Checkpoints on the RAID6 in the vm tier", checkpoint_summary),
    ]
    for name, title, lines_of in summaries:
        done = RUNS.get(name)
        if done is None or not done.done() or done.exception() is not None:
            continue
        terminalreporter.write_sep("=", title)
        try:
            lines = lines_of(done.result())
        except (KeyError, TypeError, IndexError) as exc:  # a summary, not a test's result
            lines = [f"(no summary: {exc!r})"]
        for line in lines:
            terminalreporter.write_line(line)
    done = RUNS.get("lab_runs")
    if done is None or not done.done() or done.exception() is not None:
        return
    terminalreporter.write_sep("=", "RAID0 study in the vm tier")
    for line in summary(done.result()):
        terminalreporter.write_line(line)


#: every set-up this session made, for the removal of its guests' folders
_all_early: list[Early[Any]] = []


def _made(setup: Callable[[list[Guest], Event, dict[str, str]], Any]) -> Early[Any]:
    early = Early(setup)
    _all_early.append(early)
    return early


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every set-up is stopped (those the fixtures took are already), each of them even if
    one before it fails (a second Ctrl-C, say): one that no test took, and the lab the
    study's runs took if its tests never came. The guests' folders (drive images, logs,
    the study's records) are removed when every test passed, kept to read otherwise."""
    try:
        _stop_all([early for early in _early.values() if not early.stopped])
    finally:
        folders = [guest.workdir for early in _all_early for guest in early.guests]
        for made in _links:
            shutil.rmtree(made.folder, ignore_errors=True)
        if exitstatus == pytest.ExitCode.OK:
            for folder in folders:
                shutil.rmtree(folder, ignore_errors=True)
        elif folders:
            session.config.get_terminal_writer().line(
                "vm tier: the guests' folders are kept: " + " ".join(map(str, folders))
            )


def _stop_all(rest: list[Early[Any]]) -> None:
    if rest:
        try:
            rest[0].stop()
        finally:
            _stop_all(rest[1:])


def _guests(name: str) -> Iterator[Any]:
    """The fixture *name*'s value: from its early set-up if one is waiting, else set up now;
    its guests are stopped when the fixture ends."""
    if os.geteuid() != 0:
        pytest.fail("the vm tier needs root (QEMU, loop images): run 'sudo scripts/setup.sh test'")
    early = _early.get(name)
    if early is None or early.stopped:
        early = _early[name] = _made(SETUPS[name])
    try:
        yield early.take()
    finally:
        early.stop()


@pytest.fixture(scope="session")
def vm() -> Iterator[Session]:
    yield from _guests("vm")


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """The RAID0 study's guest (tests/vm/study_lab.py), for tests/vm/test_study_vm.py and
    tests/vm/test_checkpoint_vm.py: one for the session (a module's would be stopped after
    its first module, and the next brought up anew, its runs made on the first)."""
    yield from _guests("lab")


@pytest.fixture(scope="module")
def lab_runs(lab: Lab) -> LabRuns:
    """The study's sweeps and runs on the lab (study_lab.sweeps_and_study and plans_of),
    started beside the tests marked ``beside_study`` (_StudyBeside) or now."""
    _start_runs()
    result: LabRuns = _result("lab_runs")
    return result


@pytest.fixture(scope="module")
def lost_member(lab: Lab) -> LostMember:
    """A member of raid0x2 lost mid-study (study_lab.lose_a_member), after the study."""
    _start_runs(lost=True)
    result: LostMember = _result("lost_member")
    return result


@pytest.fixture(scope="module")
def fabric_runs(lab: Lab, vm: Session) -> FabricRuns:
    """A RAID0 over two NVMe/TCP namespaces of the session guest's target, across the link,
    swept and trained on in the lab (fabric_lab.run_fabric), beside the checkpoints and the
    member lost."""
    _start_runs()
    if "fabric_runs" not in RUNS:
        raise RuntimeError("the study's runs were started without the fabric's")
    result: FabricRuns = _result("fabric_runs")
    return result


@pytest.fixture(scope="module")
def checkpoint_runs(lab: Lab) -> CheckpointRuns:
    """A run saving to the lab's RAID6 with a member failed during a save, and the run
    resumed from that save (checkpoint_lab.run_checkpoints), after the study."""
    _start_runs()
    if "checkpoint_runs" not in RUNS:
        raise RuntimeError("the study's runs were started without the checkpoints")
    result: CheckpointRuns = _result("checkpoint_runs")
    return result
