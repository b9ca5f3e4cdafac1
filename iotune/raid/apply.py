"""Executes raid plans through the process gateway, verifies each step's effect, and rolls
back what it created when a later step fails (drives are left as they were, minus the
signatures the user asked to wipe)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from iotune import proc
from iotune.errors import IotuneError
from iotune.probes.mounts import read_mounts
from iotune.probes.sysfs import SysTree
from iotune.raid.model import MD_DRIVERS, Plan, Step

WAIT_S = 30.0


class ApplyFailed(IotuneError):
    def __init__(self, step: Step, cause: IotuneError, undone: list[str]) -> None:
        rolled = "; rolled back: " + ", ".join(undone) if undone else ""
        super().__init__(
            f"step '{step.describe()}' failed: {cause.message}{rolled}",
            hint=cause.hint or "run with --debug to see every command",
        )
        self.step = step
        self.cause = cause
        self.undone = undone


class VerifyFailed(IotuneError):
    pass


def append_line(path: str, line: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = p.read_text() if p.exists() else ""
    if line in text.splitlines():
        return
    sep = "" if not text or text.endswith("\n") else "\n"
    p.write_text(text + sep + line + "\n")


def remove_line(path: str, line: str) -> None:
    p = Path(path)
    if not p.exists():
        return
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(ln for ln in lines if ln.rstrip("\n") != line))


def ensure_md(level: int, tree: SysTree) -> None:
    """Load the md driver for *level* and check the kernel now lists its personality."""
    module, personality = MD_DRIVERS[level]
    proc.run(["modprobe", module], check=False, timeout=60)
    if f"[{personality}]" not in (tree.read("/proc/mdstat") or ""):
        raise IotuneError(
            f"the running kernel has no md {personality} driver",
            hint="'iotune doctor --for raid' says what is missing",
        )


def kernel_name(device: str) -> str:
    return Path(os.path.realpath(device)).name


def wait_for(device: str) -> None:
    if proc.which("udevadm") and Path("/run/udev/control").exists():
        proc.run(["udevadm", "settle", f"--timeout={int(WAIT_S)}"], check=False, timeout=WAIT_S + 5)
    deadline = time.monotonic() + WAIT_S
    while not Path(device).exists():
        if time.monotonic() > deadline:
            raise VerifyFailed(
                f"{device} did not appear within {WAIT_S:.0f} s",
                hint="see 'dmesg' and /proc/mdstat",
            )
        time.sleep(0.1)


def verify_array(plan: Plan, tree: SysTree) -> None:
    md = kernel_name(plan.device)
    detail = proc.run(["mdadm", "--detail", "--export", plan.device], timeout=30).stdout
    facts = dict(line.split("=", 1) for line in detail.splitlines() if "=" in line)
    req = plan.request
    problems = []
    if facts.get("MD_LEVEL") != f"raid{req.level}":
        problems.append(f"level {facts.get('MD_LEVEL')}, expected raid{req.level}")
    if facts.get("MD_DEVICES") != str(len(plan.members)):
        problems.append(f"{facts.get('MD_DEVICES')} devices, expected {len(plan.members)}")
    if req.level != 1:
        chunk = tree.read_int(f"/sys/block/{md}/md/chunk_size")
        if chunk != req.chunk:
            problems.append(f"chunk {chunk}, expected {req.chunk}")
    slaves = sorted(tree.listdir(f"/sys/block/{md}/slaves"))
    want = sorted(kernel_name(m) for m in plan.members)
    if slaves != want:
        problems.append(f"members {slaves}, expected {want}")
    mdstat = tree.read("/proc/mdstat") or ""
    if not re.search(rf"^{md} : active", mdstat, re.M):
        problems.append(f"{md} is not active in /proc/mdstat")
    if problems:
        raise VerifyFailed(f"{plan.device} is not what was asked: {'; '.join(problems)}")


def verify_fs(plan: Plan) -> None:
    ident = proc.run(["blkid", "-p", "-o", "export", plan.device], check=False, timeout=30).stdout
    facts = dict(line.split("=", 1) for line in ident.splitlines() if "=" in line)
    if facts.get("TYPE") != plan.request.fs.value or facts.get("UUID") != plan.fs_uuid:
        raise VerifyFailed(
            f"{plan.device} holds {facts.get('TYPE')} {facts.get('UUID')}, "
            f"expected {plan.request.fs.value} {plan.fs_uuid}"
        )


def verify_mount(plan: Plan, tree: SysTree) -> None:
    devno = tree.read(f"/sys/block/{kernel_name(plan.device)}/dev")
    mount = (plan.request.mount or "").rstrip("/")
    if not any(m.mountpoint == mount and m.devno == devno for m in read_mounts(tree)):
        raise VerifyFailed(f"{plan.device} is not mounted at {mount}")
    if plan.request.fs.value == "xfs" and plan.alignment:
        info = proc.run(["xfs_info", mount], timeout=30).stdout
        m = re.search(r"sunit=(\d+)\s+swidth=(\d+) blks", info)
        if not m or int(m.group(1)) == 0 or int(m.group(2)) != int(m.group(1)) * plan.data_disks:
            raise VerifyFailed(
                f"XFS on {plan.device} is not aligned to the stripe: {m.group(0) if m else info[:200]}"
            )


def apply_create(
    plan: Plan, tree: SysTree, on_step: Callable[[int, Step], None] | None = None
) -> None:
    undo: list[tuple[str, Callable[[], object]]] = []
    made_dir = False
    for i, step in enumerate(plan.steps):
        if on_step:
            on_step(i, step)
        try:
            if step.kind == "wait":
                wait_for(plan.device)
                verify_array(plan, tree)
            elif step.kind in ("conf", "fstab"):
                path, line = _file_edit(step)
                append_line(path, line)
                undo.append((f"line in {path}", partial(remove_line, path, line)))
            elif step.kind == "mkdir":
                made_dir = not Path(step.argv[-1]).exists()
                proc.run(step.argv, timeout=30)
                if made_dir:
                    d = step.argv[-1]
                    undo.append((f"directory {d}", partial(_rmdir, d)))
            else:
                proc.run(step.argv, timeout=600)
                if step.kind == "create":
                    undo.append((f"array {plan.device}", partial(_remove_array, plan)))
                elif step.kind == "mount":
                    m = step.argv[-1]
                    undo.append((f"mount {m}", partial(proc.run, ["umount", m], check=False)))
                    verify_mount(plan, tree)
                elif step.kind == "mkfs":
                    verify_fs(plan)
        except IotuneError as exc:
            undone = []
            for what, fn in reversed(undo):
                try:
                    fn()
                    undone.append(what)
                except IotuneError:
                    undone.append(f"{what} (FAILED: clean up by hand)")
            raise ApplyFailed(step, exc, undone) from exc


def _file_edit(step: Step) -> tuple[str, str]:
    if not (step.path and step.line):
        raise ValueError(f"step {step.kind} names no file and line")
    return step.path, step.line


def _rmdir(d: str) -> None:
    try:
        os.rmdir(d)
    except OSError:
        return


def _remove_array(plan: Plan) -> None:
    if Path(plan.device).exists():
        # a filesystem made on the array lives inside the members' data area: erase it too
        proc.run(["wipefs", "--all", plan.device], check=False, timeout=60)
        proc.run(["mdadm", "--stop", plan.device], timeout=60)
    proc.run(["mdadm", "--zero-superblock", *plan.members], check=False, timeout=60)


def apply_steps(steps: list[Step], on_step: Callable[[int, Step], None] | None = None) -> None:
    """Destroy: no rollback (each step makes the volume more gone); stop at the first failure."""
    for i, step in enumerate(steps):
        if on_step:
            on_step(i, step)
        if step.kind in ("unconf", "unfstab"):
            remove_line(*_file_edit(step))
        else:
            proc.run(step.argv, timeout=600)
