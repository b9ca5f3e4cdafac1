#!/usr/bin/env python3
"""Where a running `.ci/run` spends the host's CPU: the seconds of CPU of each part of it,
every 15 s and at its end, so that a cut of the suite's time is made where the time goes.

    scripts/ci_under_load.py --cpu 1 &
    scripts/ci_cpu.py PID ci-cpu.json      # PID: its .ci/run (exec'd into pytest)

The parts: ``lab`` (the study lab's guest), ``qemu`` (the vm tier's other guests: everything
they run is emulated), ``mutation``
(the mutation gate: scripts/mutation.py and mutmut), ``fresh_root`` (the set-up in an empty
Debian root) and ``tests`` (the rest of PID's processes: pytest, its workers, the tools they
start). Each process is moved, once, into a cgroup of its part in the cgroup v1 ``cpuacct``
hierarchy, whose counter keeps the CPU of every process that ever ran in it, short-lived ones
too; the children a process starts afterwards are born in its cgroup. Only cpuacct is
touched: the scheduler's cgroups (``cpu``) and the unified hierarchy, which the tests' own
``--cgroup`` filters use, are left as they are. Root; the cgroups are removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

ACCT = Path("/sys/fs/cgroup/cpuacct")
PARTS = ("tests", "lab", "qemu", "mutation", "fresh_root")
#: a process's part by its own command line (or name), whatever cgroup its parent had
MARKS = (
    ("iotune-study-vm-", "lab"),  # the study lab's guest (its drives' files are there)
    ("qemu-system", "qemu"),
    ("mutation.py", "mutation"),
    ("mutmut", "mutation"),
    ("fresh_root.sh", "fresh_root"),
)


def _stat(pid: int) -> tuple[str, int, int]:
    """name, parent pid, session id."""
    text = Path(f"/proc/{pid}/stat").read_text()
    rest = text[text.rindex(")") + 2 :].split()
    return text[text.index("(") + 1 : text.rindex(")")], int(rest[1]), int(rest[3])


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    return ""


def _cgroup(pid: int) -> str | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "cpuacct" in controllers.split(","):
                return path
    return None


def _mark(pid: int, name: str) -> str | None:
    text = _cmdline(pid) + " " + name
    return next((part for mark, part in MARKS if mark in text), None)


def _under(pid: int, top: int) -> bool:
    for _ in range(64):
        if pid == top:
            return True
        try:
            pid = _stat(pid)[1]
        except OSError:
            return False
        if pid <= 1:
            return False
    return False


def usage() -> dict[str, float]:
    return {p: int((ACCT / f"ci_{p}" / "cpuacct.usage").read_text()) / 1e9 for p in PARTS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "pid",
        type=int,
        help="the running .ci/run (exec'd into pytest); the load beside it is not counted",
    )
    ap.add_argument("out", type=Path, help="JSON: CPU seconds of each part, every 15 s")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("ci_cpu: needs root (it moves processes between cgroups)")
    if not (ACCT / "cgroup.procs").exists():
        sys.exit(
            f"ci_cpu: no cgroup v1 cpuacct hierarchy at {ACCT}: this host cannot be counted so"
        )
    for p in PARTS:
        (ACCT / f"ci_{p}").mkdir(exist_ok=True)
    start = usage()
    t0 = time.monotonic()
    timeline: list[dict[str, float]] = []
    skip: set[int] = set()
    sessions: dict[int, str] = {}
    last = -15.0
    try:
        while Path(f"/proc/{args.pid}").exists():
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit() or int(entry.name) in skip:
                    continue
                pid = int(entry.name)
                group = _cgroup(pid)
                try:
                    name, _, sid = _stat(pid)
                except OSError:
                    continue
                part = _mark(pid, name)
                if group == "/":
                    if not _under(pid, args.pid):
                        skip.add(pid)
                        continue
                    part = part or sessions.get(sid) or "tests"
                elif group == "/ci_tests":
                    # a background command started by the tests: its own session
                    part = part or sessions.get(sid)
                    if part is None:
                        continue
                else:
                    continue
                if part != "tests":
                    sessions[sid] = part
                with contextlib.suppress(OSError):
                    (ACCT / f"ci_{part}" / "cgroup.procs").write_text(str(pid))
            now = time.monotonic() - t0
            if now - last >= 15:
                last = now
                timeline.append(
                    {"t": round(now), **{k: round(v - start[k], 1) for k, v in usage().items()}}
                )
                args.out.write_text(json.dumps({"parts": PARTS, "timeline": timeline}, indent=1))
            time.sleep(0.3)
    finally:
        end = {k: round(v - start[k], 1) for k, v in usage().items()}
        timeline.append({"t": round(time.monotonic() - t0), **end})
        args.out.write_text(json.dumps({"parts": PARTS, "timeline": timeline}, indent=1))
        for p in PARTS:
            with contextlib.suppress(OSError):
                (ACCT / f"ci_{p}").rmdir()  # a cgroup with live processes stays
        print("ci_cpu: CPU seconds " + ", ".join(f"{k} {v:.0f}" for k, v in end.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
