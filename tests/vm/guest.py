"""A QEMU guest (virtme-ng, no KVM) with emulated NVMe drives, booted once and driven by
tests/vm/agent.py through a shared directory.

The guest shares the host's root filesystem read-only (virtme-ng), so it runs this very
virtualenv, mdadm and fio against a distribution kernel that has the nvme and md drivers.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import os
import shlex
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from threading import Event, Lock
from typing import Generic, TypeVar

from tests.progress import renice_session

HERE = Path(__file__).resolve().parent
TOP = HERE.parent.parent
T = TypeVar("T")
#: a guest command's default limit, a hang detector: beside `.ci/run` under load
#: (benchmarks/RESULTS.md, 2026-11-29) plain commands of a guest booted while the lab's guest
#: emulated its study took up to 188 s (the fabric guests' NIC set-up, --bursty; the first
#: Python of a guest, 120 s under --cpu 1): 1.6x under the 300 s they had, where a limit
#: must sit 5x above the longest seen under load
COMMAND_LIMIT_S = 1200.0
#: every command a guest answered: its seconds, its limit, its first words (the session's
#: summary names those nearest their limit: each limit is a hang detector, far above them)
WAITS: list[tuple[float, float, str]] = []


#: every guest's kernel options: no test of the timer's interrupt through the IO-APIC at boot.
#: An emulated CPU descheduled by a busy host misses the ticks that test counts, and the
#: kernel panics ("IO-APIC + timer doesn't work!"): a `.ci/run` with one CPU-bound loop beside
#: it lost the session guest so, and every test of it (22 errors)
BOOT_APPEND: tuple[str, ...] = ("no_timer_check",)


def clock_options(
    host_clock: Path = Path("/sys/devices/system/clocksource/clocksource0"),
) -> tuple[str, ...]:
    """The guest's clock read from its TSC, where the host's own clock is the TSC. Under TCG
    the guest's TSC is the host's (QEMU's rdtsc returns the host's ticks, kept monotonic
    across the vCPUs), but the guest's kernel finds its vCPUs' TSCs "unsynchronized" (its
    check times them, and an emulated CPU is slow) and falls back to the HPET, whose every
    read is an emulated device's register: each timer, tick and context switch of the guest
    pays for one. With the TSC, in one guest on a quiet 2-core host: the imports of torch,
    DeepSpeed and transformers 128 s against 154.6 s, twenty 512x512 matmuls 252 s against
    306 s, the guest's host CPU 651 s against 782 s (benchmarks/RESULTS.md, 2026-11-30).
    Where the host itself does not trust its TSC, the guest keeps its own choice."""
    try:
        mine = (host_clock / "current_clocksource").read_text().strip()
    except OSError:
        return ()
    return ("clocksource=tsc", "tsc=reliable") if mine == "tsc" else ()


@dataclass(frozen=True)
class Drive:
    serial: str
    size_mib: int = 128
    prepare: str = "blank"  # "blank" | "ext4" (formatted on the host before boot)
    files: tuple[tuple[str, str], ...] = ()  # (name, content) put into the ext4 filesystem
    #: the drive's bandwidth, reads and writes each (bytes/s; 0: none), set in the guest by
    #: the block layer's throttle (Guest.throttle), not QEMU's (THROTTLE says why)
    bps: int = 0


@dataclass(frozen=True)
class Link:
    """A virtual network between two guests of one session, as two hosts on one wire: each
    guest's virtio-net NIC on QEMU's datagram netdev, the two unix sockets in *folder* (each
    guest binds its own and sends to the other's; a frame sent before the other is up is
    dropped, as on a wire). No bridge, tap or host network set-up. Guest *me* (1 or 2) is
    10.78.0.*me*; its NIC says *speed_mbps* in /sys/class/net/IF/speed, as a real one does."""

    folder: Path
    speed_mbps: int = 10000
    #: jumbo frames: each frame is a datagram through two emulated NICs without offloads, so
    #: the link carries about as many frames a second whatever their size; 9000-byte frames
    #: carry six times the bytes of 1500-byte ones
    mtu: int = 9000

    @staticmethod
    def addr(me: int) -> str:
        return f"10.78.0.{me}"

    @staticmethod
    def mac(me: int) -> str:
        return f"52:54:00:78:00:{me:02x}"

    def qemu_opts(self, me: int) -> tuple[str, ...]:
        mine, other = (self.folder / f"guest{n}.sock" for n in (me, 3 - me))
        return (
            "-device",
            f"virtio-net-pci,netdev=link,mac={self.mac(me)},speed={self.speed_mbps},duplex=full,"
            f"host_mtu={self.mtu}",
            "-netdev",
            f"dgram,id=link,local.type=unix,local.path={mine},remote.type=unix,remote.path={other}",
        )

    def up(self, guest: Guest, me: int) -> str:
        """The guest's end of the link configured (its NIC's driver loaded, the address set,
        the link up); its interface's name."""
        script = (
            "import glob, os, subprocess, sys, time\n"
            "subprocess.run(['modprobe', 'virtio_net'], check=True)\n"
            "deadline = time.monotonic() + 30\n"
            "while True:\n"
            "    found = [os.path.basename(os.path.dirname(a)) for a in "
            "glob.glob('/sys/class/net/*/address') if open(a).read().strip() == sys.argv[1]]\n"
            "    if found or time.monotonic() > deadline:\n"
            "        break\n"
            "    time.sleep(0.2)\n"
            "if not found:\n"
            "    sys.exit('no NIC with MAC ' + sys.argv[1])\n"
            "subprocess.run(['ip', 'addr', 'add', sys.argv[2] + '/24', 'dev', found[0]], check=True)\n"
            "subprocess.run(['ip', 'link', 'set', found[0], 'mtu', sys.argv[3]], check=True)\n"
            "subprocess.run(['ip', 'link', 'set', found[0], 'up'], check=True)\n"
            "print(found[0])\n"
        )
        out = guest.run(
            [sys.executable, "-c", script, self.mac(me), self.addr(me), str(self.mtu)]
        ).check()
        return out.stdout.strip()


@dataclass
class Result:
    argv: list[str]
    rc: int
    stdout: str
    stderr: str

    def check(self) -> Result:
        if self.rc != 0:
            raise AssertionError(
                f"guest command {shlex.join(self.argv)} failed ({self.rc}):\n{self.stderr[-3000:]}"
            )
        return self


#: in the guest: each disk named in argv[1] ({name: bytes/s}, name as in /sys/block)
#: throttled by the block layer (cgroup v2's io.max, rbps and wbps) for every process of the
#: guest, all moved into one cgroup, whose children stay in it. Not QEMU's throttle
#: (``throttling.bps-total``): its leaky bucket passes a request whenever its level is under
#: a tenth of a second's bytes, so after each idle spell a drive at 2 MiB/s takes its first
#: 512 KiB request at once and its second 0.15 s later. On the study's RAID0 of four, a
#: step's short phases (the parameters' fetches, one request per drive; the gradients' and
#: the updated parameters' writes, two) then took little more than nothing, and the step with
#: the parameters on NVMe ran 12 to 26% under the sum of its parts. The block layer charges a
#: request before it goes: at 2 MiB/s, after a second idle, one 512 KiB O_DIRECT write took
#: 0.276 s and eight 2.003 s, against QEMU's 0.017 and 1.653 s (benchmarks/RESULTS.md,
#: 2026-12-01).
THROTTLE = """
import json, os, subprocess, sys
limits = json.loads(sys.argv[1])
root = "/sys/fs/cgroup"
if not os.path.exists(root + "/cgroup.controllers"):
    subprocess.run(["mount", "-t", "cgroup2", "cgroup2", root], check=True)
with open(root + "/cgroup.subtree_control", "w") as f:
    f.write("+io")
cg = root + "/iotune-drives"
os.makedirs(cg, exist_ok=True)
for name, bps in sorted(limits.items()):
    dev = open(f"/sys/block/{name}/dev").read().strip()
    with open(cg + "/io.max", "w") as f:
        f.write(f"{dev} rbps={bps} wbps={bps}")
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            with open(cg + "/cgroup.procs", "w") as f:
                f.write(pid)
        except OSError:
            pass  # a kernel thread, or a process gone meanwhile
"""
#: the mount tags of the folders the agent mounts again with a cache (cached_folders)
CACHED_TAG = "iotune-ro{}"


def cached_folders() -> list[Path]:
    """The folders each guest mounts again read-only with 9p's cache (cache=loose): Python's
    standard library, the virtualenv's packages and iotune's own, which nothing writes
    while a guest runs. virtme-ng shares the host's root over 9p without a cache, so every
    stat and open of an import is a round trip through the emulated virtio, and again in
    the next process: torch, DeepSpeed and transformers imported in a guest here took 515 s
    uncached, 274 s the first time with the cache and 226 s the next. A folder inside one
    already listed is left to it."""
    paths = sysconfig.get_paths()
    found = {Path(paths[k]).resolve() for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    found.add(TOP / "iotune")
    out: list[Path] = []
    for path in sorted((p for p in found if p.is_dir()), key=lambda p: len(p.parts)):
        if not any(o in path.parents for o in out):
            out.append(path)
    return out


#: host folders the guest does not see: virtme-ng's init mounts a fresh tmpfs over each
#: (virtme/guest/virtme-init: /run, /var/log, /var/tmp, /var/cache, ...), so a checkout, a
#: virtualenv or a share under one of them is an empty folder in the guest
HIDDEN_IN_GUEST = (
    "/run",
    "/var/log",
    "/var/tmp",
    "/var/spool/rsyslog",
    "/var/lib/portables",
    "/var/lib/machines",
    "/var/lib/private",
    "/var/cache",
    "/var/lib/apt",
    "/var/lib/snapd/cookie",
    "/var/lib/sudo",
    "/dev/shm",
)


def hidden_from_guest(*paths: Path) -> str | None:
    """One line naming the first of *paths* the guest cannot see and the way around it;
    None where the guest sees them all."""
    for path in paths:
        # as written (a virtualenv's python is a link out of it) and with its links followed
        for real in dict.fromkeys((path.absolute(), path.resolve())):
            hidden = next(
                (h for h in HIDDEN_IN_GUEST if real == Path(h) or Path(h) in real.parents), None
            )
            if hidden is not None:
                return (
                    f"the vm tier cannot run from {real}: its guest mounts a fresh {hidden} "
                    "(virtme-ng), so it does not see the checkout or its virtualenv there; "
                    "clone the repository elsewhere (under /tmp, /home or /srv) and run "
                    "'scripts/setup.sh test' there, or put the virtualenv elsewhere "
                    "(VENV=/srv/iotune-venv)"
                )
    return None


def find_kernel() -> tuple[Path, str]:
    """A distribution kernel whose modules include nvme and md (IOTUNE_VM_KERNEL overrides)."""
    override = os.environ.get("IOTUNE_VM_KERNEL")
    candidates = (
        [Path(override)] if override else sorted(Path("/boot").glob("vmlinuz-*"), reverse=True)
    )
    for image in candidates:
        version = image.name.removeprefix("vmlinuz-")
        mods = Path("/lib/modules") / version / "kernel" / "drivers"
        if (mods / "nvme").is_dir() and (mods / "md").is_dir():
            return image, version
    raise RuntimeError(
        "no kernel image with nvme and md modules under /boot "
        "(scripts/setup.sh test installs linux-image-amd64)"
    )


class Guest:
    def __init__(
        self,
        workdir: Path,
        drives: list[Drive],
        memory: str = "2G",
        qemu_opts: tuple[str, ...] = (),
        append: tuple[str, ...] = (),
        rwdirs: tuple[Path, ...] = (),
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.drives = drives
        self.memory = memory
        self.qemu_opts = qemu_opts
        self.append = append
        self.rwdirs = rwdirs  # host folders the guest may write (besides the share)
        #: the environment QEMU and the agent start in (default: this process's at start)
        self.environ = environ
        self.share = workdir / "share"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "guest.log"
        # the commands' numbers: next() of a count is atomic, and the study's runs go on
        # on a thread of their own while tests use the same guest
        self._seq = itertools.count(1)
        #: this object started the guest and stops it (not so a second agent's, see agent())
        self.owner = True

    def _prepare_images(self) -> list[Path]:
        images = []
        for i, d in enumerate(self.drives):
            img = self.workdir / f"nvme{i}-{d.serial}.img"
            with img.open("wb") as fh:
                fh.truncate(d.size_mib * 2**20)
            if d.prepare == "ext4":
                content = self.workdir / f"content-{d.serial}"
                content.mkdir()
                for name, text in d.files:
                    (content / name).write_text(text)
                subprocess.run(
                    ["mkfs.ext4", "-q", "-F", "-L", d.serial.lower(), "-d", str(content), str(img)],
                    check=True,
                )
            images.append(img)
        return images

    def start(self, timeout: float = COMMAND_LIMIT_S) -> None:
        hidden = hidden_from_guest(TOP, Path(sys.executable).parent, self.share, *self.rwdirs)
        if hidden is not None:
            raise RuntimeError(hidden)
        self.share.mkdir(parents=True, exist_ok=True)
        images = self._prepare_images()
        kernel, _version = find_kernel()
        qemu = list(self.qemu_opts)
        for i, (img, d) in enumerate(zip(images, self.drives, strict=True)):
            qemu += [
                "-drive",
                f"file={img},if=none,id=n{i},format=raw,cache=unsafe",
                "-device",
                f"nvme,serial={d.serial},drive=n{i}",
            ]
        cached = [(CACHED_TAG.format(i), str(p)) for i, p in enumerate(cached_folders())]
        for tag, path in cached:
            qemu += [
                "-virtfs",
                f"local,path={path},mount_tag={tag},security_model=none,readonly=on",
            ]
        (self.share / "cached.json").write_text(json.dumps(cached))
        venv_bin = Path(sys.executable).parent
        agent = f"{shlex.quote(sys.executable)} {shlex.quote(str(HERE / 'agent.py'))} {shlex.quote(str(self.share))}"
        argv = [
            str(venv_bin / "vng"),
            "--run",
            str(kernel),
            "--disable-kvm",
            # the kernel's console into the guest's log: a guest that dies before its agent
            # answers (a panic, an init that failed) says why in the failure's log tail
            "--verbose",
            "--user",
            "root",
            "--memory",
            self.memory,
            "--cpus",
            "2",
            "--rwdir",
            str(self.share),
            *(a for d in self.rwdirs for a in ("--rwdir", str(d))),
            "--qemu-opts=" + " ".join(qemu),
            *(f"--append={a}" for a in (*BOOT_APPEND, *clock_options(), *self.append)),
            "--exec",
            agent,
        ]
        env = dict(os.environ if self.environ is None else self.environ)
        env["PATH"] = f"{venv_bin}:{env.get('PATH', '/usr/bin:/bin')}"
        log = self.log_path.open("wb")
        # a session of its own: vng runs QEMU through a shell and virtme-run, so ``kill``
        # ends the whole group, QEMU with it
        self.proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        # the starting thread's CPU priority for all of it (its session is an autogroup of
        # its own, which the scheduler weighs against the others by the group's nice only),
        # again if the thread's changed meanwhile (Early.take)
        nice = None
        while nice != (now := os.getpriority(os.PRIO_PROCESS, 0)):
            nice = now
            self.renice(nice)
        # the deadline counts the time the boot is wanted: while its thread waits at the
        # lowest priority for the tests before to finish (Early), a busy host may give it
        # nothing, and that is not the guest's delay
        last = time.monotonic()
        deadline = last + timeout
        while not (self.share / "ready").exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"guest exited early ({self.proc.returncode}):\n{self.log_tail()}"
                )
            t = time.monotonic()
            if os.getpriority(os.PRIO_PROCESS, 0) >= IDLE_NICE:
                deadline += t - last
            last = t
            if t > deadline:
                self.stop()
                raise RuntimeError(f"guest did not come up in {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def run(
        self,
        argv: list[str],
        timeout: float = COMMAND_LIMIT_S,
        input: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Result:
        name = f"{next(self._seq):06d}.json"
        cmd = self.share / f"cmd-{name}"
        tmp = self.share / f"tmp-{name}"
        tmp.write_text(
            json.dumps({"argv": argv, "timeout": timeout, "input": input, "env": env or {}})
        )
        tmp.rename(cmd)
        res = self.share / f"res-{name}"
        t0 = time.monotonic()
        self._await(res, timeout + 30, f"running {argv}", f"answer {argv} in {timeout:.0f} s")
        WAITS.append((time.monotonic() - t0, timeout, " ".join([Path(argv[0]).name, *argv[1:4]])))
        data = json.loads(res.read_text())
        return Result(argv, data["rc"], data["stdout"], data["stderr"])

    def spawn(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> int:
        """Start *argv* in the guest without waiting (output in *log*, a shared path)."""
        name = f"{next(self._seq):06d}.json"
        tmp = self.share / f"tmp-{name}"
        tmp.write_text(
            json.dumps({"argv": argv, "background": True, "log": str(log), "env": env or {}})
        )
        tmp.rename(self.share / f"cmd-{name}")
        res = self.share / f"res-{name}"
        self._await(res, 60, f"starting {argv}", f"start {argv}")
        return int(json.loads(res.read_text())["stdout"])

    def _await(self, res: Path, seconds: float, doing: str, undone: str) -> None:
        """Until the agent has written *res*; the guest's death or *seconds* end the wait."""
        deadline = time.monotonic() + seconds
        proc = self.proc  # kill() forgets it: a guest killed meanwhile ends the wait
        while not res.exists():
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"guest died while {doing}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"guest did not {undone}\n{self.doing()}")
            time.sleep(0.05)

    def doing(self) -> str:
        """What the guest was doing at its agent's last snapshot of a running command (its
        processes, their states and wait channels, md's state, the kernel log's end) and the
        console's last lines: what a wait that ran out reports."""
        snap = self.share / "doing.txt"
        try:
            text = snap.read_text()
        except OSError:
            text = "(no snapshot of the running command)"
        return f"{text}--- console:\n{self.log_tail()}"

    def iotune(self, *args: str, timeout: float = COMMAND_LIMIT_S) -> Result:
        return self.run([str(Path(sys.executable).parent / "iotune"), *args], timeout=timeout)

    def agent(self, name: str, timeout: float = COMMAND_LIMIT_S) -> Guest:
        """A second agent in the guest, reading its commands from SHARE/NAME: the first runs
        one command at a time, and a command sent to this one runs beside it. The object
        returned sends its commands there; the guest stays this object's to stop."""
        d = self.share / name
        d.mkdir()
        self.spawn([sys.executable, str(HERE / "agent.py"), str(d)], self.share / f"{name}.log")
        self._await(d / "ready", timeout, f"starting the agent {name}", f"start agent {name}")
        other = copy.copy(self)
        other.share = d
        other._seq = itertools.count(1)
        other.owner = False
        return other

    def by_serial(self) -> dict[str, str]:
        """Guest disk name (nvme0n1 …) of each drive serial, read from sysfs."""
        script = (
            "import glob, os\n"
            "for d in sorted(glob.glob('/sys/block/nvme*')):\n"
            "    print(os.path.basename(d), open(d + '/device/serial').read().strip())\n"
        )
        out = self.run([sys.executable, "-c", script]).check()
        pairs = [line.split() for line in out.stdout.splitlines() if line.strip()]
        return {serial: name for name, serial in pairs}

    def throttle(self, names: dict[str, str]) -> None:
        """Each drive with a ``bps`` at that many bytes a second, reads and writes each, for
        every process of the guest now and every one they start (THROTTLE); *names*: each
        drive's disk by serial (by_serial), once the nvme driver has found the drives."""
        limits = {names[d.serial]: d.bps for d in self.drives if d.bps}
        if limits:
            self.run([sys.executable, "-c", THROTTLE, json.dumps(limits)]).check()

    def stop(self) -> None:
        if self.proc is None or not self.owner:
            return
        if self.proc.poll() is None:
            try:
                tmp = self.share / "tmp-exit.json"
                tmp.write_text(json.dumps({"argv": ["__exit__"]}))
                tmp.rename(self.share / "cmd-999999.json")
                self.proc.wait(timeout=60)
            except (subprocess.TimeoutExpired, OSError):
                pass
        self.kill()

    def renice(self, nice: int) -> None:
        """Every process of the guest (vng, virtme-run, QEMU and all its threads), and its
        autogroup, at CPU priority *nice*."""
        if self.proc is not None:
            renice_session(self.proc.pid, nice)

    def kill(self) -> None:
        """Kills the guest's whole process group (vng, virtme-run, QEMU), whatever is left."""
        if self.proc is None or not self.owner:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None


#: the CPU priority of a set-up that no test waits for: the lowest, so that its emulated
#: CPU takes what the tests leave idle and never delays them (a tracer's polls, say)
IDLE_NICE = 19


class Early(Generic[T]):
    """A guests' set-up run on a thread of its own, so that its boot and imports (minutes
    of emulated CPU that measure nothing) overlap the tests before the ones that use it.
    Until a test takes it, it runs at the lowest CPU priority (IDLE_NICE: its thread, what
    the thread starts, its guests and their autogroups); ``take`` puts all of it back to
    the tests' priority (or the one it is given) and waits for its result.

    *setup(guests, cancel, environ)* puts each guest it makes into *guests* as soon as it
    exists, ends (raises) at its next stage once *cancel* is set, and starts what it starts
    in *environ*: this process's environment when the set-up began, as tests running
    meanwhile may change it."""

    def __init__(self, setup: Callable[[list[Guest], Event, dict[str, str]], T]) -> None:
        self.guests: list[Guest] = []
        self.cancel = Event()
        self.taken = False
        self.stopped = False
        self._thread: int | None = None
        self._lock = Lock()
        self._nice = os.getpriority(os.PRIO_PROCESS, 0)  # this (the tests') thread's
        pool = ThreadPoolExecutor(1, "guest-setup")
        self._future = pool.submit(self._idle, setup, dict(os.environ))
        pool.shutdown(wait=False)

    def _idle(
        self, setup: Callable[[list[Guest], Event, dict[str, str]], T], env: dict[str, str]
    ) -> T:
        with self._lock:
            if not self.taken:
                self._thread = threading.get_native_id()
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, self._thread, IDLE_NICE)
        try:
            return setup(self.guests, self.cancel, env)
        finally:
            with self._lock:  # the guests keep theirs until taken
                self._thread_back()

    def _thread_back(self) -> None:
        """The set-up thread, if it still runs low, at the tests' priority (under the lock)."""
        if self._thread is not None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, self._thread, self._nice)
            self._thread = None

    def take(self, nice: int | None = None) -> T:
        """Waits for the set-up's result; the first take puts it at the tests' priority, or
        at *nice*."""
        with self._lock:
            if not self.taken:
                self.taken = True
                if nice is not None:
                    self._nice = nice
                # the thread first: a guest it starts from now on starts at that priority
                self._thread_back()
                for guest in list(self.guests):
                    guest.renice(self._nice)
        return self._future.result()

    def stop(self) -> None:
        """Stops its guests; a set-up still under way is cancelled, each guest it has
        started (or starts meanwhile) killed, so that it ends at its next wait."""
        self.stopped = True
        self.cancel.set()
        while not wait([self._future], timeout=0.5).done:
            for guest in list(self.guests):
                proc = guest.proc
                if proc is not None and proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
        for guest in self.guests:
            guest.stop()
