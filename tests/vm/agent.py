"""Runs inside the QEMU guest: executes commands the host drops into a shared directory.

Protocol (files in DIR, written atomically with rename): the host writes ``cmd-N.json``
(``{"argv": [...], "timeout": s, "input": str|null}``); the agent runs it without a shell
and writes ``res-N.json`` (``{"rc", "stdout", "stderr"}``); ``"env"`` adds variables,
``"background": true`` with ``"log": PATH`` starts it without waiting (its pid is the stdout). ``ready`` appears once the
agent runs; ``{"argv": ["__exit__"]}`` ends it (and the guest).

The ``iotune`` command itself (this virtualenv's console script, argv[0]) runs as iotune's own
zygote runs its workers: forked from this agent, which imported iotune's command line and
its commands once, its ``main()`` called with the command's arguments, environment, stdin
and its stdout and stderr in files. It is the same code as the console script's; the guest's
emulated CPU spends 7 to 15 s importing it, per command, which measures nothing.
"""

import atexit
import contextlib
import importlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

#: the console script that forks from the agent (``iotune`` beside this interpreter)
IOTUNE = os.path.join(os.path.dirname(sys.executable), "iotune")
_WARM: set[str] = set()
#: how the agent mounts the folders nothing writes while the guest runs (_mount_cached)
CACHED_OPTS = "trans=virtio,version=9p2000.L,cache=loose,msize=512000,ro"


def _warm_up() -> None:
    """iotune's command line and every command's module, imported once."""
    if _WARM:
        return
    from iotune.cli import app

    for where in app.COMMANDS.values():
        module = "iotune.cli." + where.split(":")[0]
        importlib.import_module(module)
        _WARM.add(module)


def _child(argv: list[str], env: dict[str, str], stdin: str, out: int, err: int) -> None:
    """In the forked child: the command's stdin and the pipes as fds 0-2, then iotune's
    main(); exits as the interpreter would (threads joined, atexit run, streams flushed)."""
    code = 1
    try:
        f = os.open(stdin, os.O_RDONLY)
        os.dup2(f, 0)
        os.close(f)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        os.environ.update(env)
        sys.argv = list(argv)
        try:
            from iotune.cli import main as iotune_main

            iotune_main()
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught one
            traceback.print_exc()
            code = 1
        threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own join
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _forked(cmd: dict[str, Any]) -> dict[str, Any]:
    """An ``iotune`` command run in a child forked from the warm agent; its output read to
    the end, as subprocess.run reads it: until every process holding its pipes (the
    command's own children too) has closed them."""
    _warm_up()
    inp = os.devnull
    tmp = None
    if cmd.get("input") is not None:
        fd, tmp = tempfile.mkstemp(prefix="agent-in-")
        with os.fdopen(fd, "w") as fh:
            fh.write(cmd["input"])
        inp = tmp
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(err_r)
        _child(cmd["argv"], cmd.get("env", {}), inp, out_w, err_w)
    os.close(out_w)
    os.close(err_w)
    deadline = time.monotonic() + cmd.get("timeout", 120)
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    sel = selectors.DefaultSelector()
    for fd in chunks:
        sel.register(fd, selectors.EVENT_READ)
    timed_out = False
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(left, 1.0)):
            data = os.read(key.fd, 65536)
            if data:
                chunks[key.fd].append(data)
            else:
                sel.unregister(key.fd)
    sel.close()
    if timed_out:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    for fd in chunks:
        os.close(fd)
    if tmp is not None:
        os.unlink(tmp)
    stdout, stderr = (b"".join(chunks[fd]).decode(errors="replace") for fd in (out_r, err_r))
    if timed_out:
        return {"rc": -9, "stdout": stdout, "stderr": "timeout"}
    return {"rc": os.waitstatus_to_exitcode(status), "stdout": stdout, "stderr": stderr}


#: a command running longer than the first figure has a snapshot written (``doing.txt``)
#: then and every second figure's seconds after, for the host to show where a wait ran out:
#: what the guest was doing, not only that it took long (a shorter one costs nothing). Each
#: snapshot starts ps and dmesg on the emulated CPU: every 2 minutes, not every 30 s (the
#: study's guest ran commands for 55 minutes of a run, 3 processes a snapshot)
SNAPSHOT_S = (60.0, 120.0)


def _snapshot(d: str, argv: list[str], started: float) -> None:
    """What the guest is doing while *argv* runs: the command and its age, every process
    with its state and the kernel function it sleeps in (a process in D waits on the
    kernel: I/O, md), md's state and the kernel log's last lines; written atomically."""
    parts = [f"running {argv} for {time.monotonic() - started:.0f} s"]
    for what, cmd in (
        ("processes", ["ps", "-eo", "pid,stat,wchan:28,etime,args", "--sort=start_time"]),
        ("md", ["cat", "/proc/mdstat"]),
        ("kernel log", ["dmesg", "--ctime"]),
    ):
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
            lines = out.stdout.splitlines()
            if what == "processes":  # kernel threads only where they wait in the kernel (D)
                lines = [
                    x
                    for i, x in enumerate(lines)
                    if i == 0
                    or len(x.split(None, 4)) < 5
                    or not x.split(None, 4)[4].startswith("[")
                    or "D" in x.split(None, 4)[1]
                ]
            elif what == "kernel log":
                lines = lines[-25:]
            parts.append(f"--- {what}:\n" + "\n".join(lines))
        except (OSError, subprocess.TimeoutExpired) as exc:
            parts.append(f"--- {what}: {exc}")
    tmp = os.path.join(d, "doing.tmp")
    with open(tmp, "w") as fh:
        fh.write("\n".join(parts) + "\n")
    os.rename(tmp, os.path.join(d, "doing.txt"))


class _Watch:
    """Snapshots of the guest while one command runs (SNAPSHOT_S)."""

    def __init__(self, d: str, argv: list[str]) -> None:
        self.stop = threading.Event()
        started = time.monotonic()

        def loop() -> None:
            wait = SNAPSHOT_S[0]
            while not self.stop.wait(wait):
                wait = SNAPSHOT_S[1]
                with contextlib.suppress(OSError):
                    _snapshot(d, argv, started)

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def __enter__(self) -> "_Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()


def _mount_cached(d: str) -> None:
    """The folders the host lists in ``cached.json`` (tests/vm/guest.py: cached_folders)
    mounted again over themselves, read-only, with 9p's cache: what one process looked up
    there stays for the next. A mount that fails ends the agent (the guest's log says why)."""
    listed = os.path.join(d, "cached.json")
    if not os.path.exists(listed):
        return  # a second agent of a guest whose first mounted them
    with open(listed) as fh:
        for tag, where in json.load(fh):
            subprocess.run(
                ["mount", "-t", "9p", "-o", CACHED_OPTS, tag, where], check=True, timeout=120
            )


def main() -> None:
    d = sys.argv[1]
    _mount_cached(d)
    with open(os.path.join(d, "ready.tmp"), "w") as fh:
        fh.write(str(os.getpid()))
    os.rename(os.path.join(d, "ready.tmp"), os.path.join(d, "ready"))
    done = set()
    idle = 0.05
    while True:
        names = sorted(n for n in os.listdir(d) if n.startswith("cmd-") and n.endswith(".json"))
        todo = [n for n in names if n not in done]
        if not todo:
            # each look at the shared folder costs the emulated CPU: look less often when idle
            # (at most 2 s late for a command after a long idle; none between commands)
            time.sleep(idle)
            idle = min(2.0, idle * 1.5)
            continue
        idle = 0.05
        for name in todo:
            done.add(name)
            with open(os.path.join(d, name)) as fh:
                cmd = json.load(fh)
            if cmd["argv"] == ["__exit__"]:
                return
            if cmd.get("background"):
                # a server the later commands use: started, never waited for
                with open(cmd["log"], "wb") as log:
                    bg = subprocess.Popen(
                        cmd["argv"],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env={**os.environ, **cmd.get("env", {})},
                        start_new_session=True,
                    )
                res = {"rc": 0, "stdout": str(bg.pid), "stderr": ""}
                out = os.path.join(d, "res-" + name[4:])
                with open(out + ".tmp", "w") as fh:
                    json.dump(res, fh)
                os.rename(out + ".tmp", out)
                continue
            # a variable the interpreter reads as it starts would not reach a fork of it
            starts = any(k.startswith("PYTHON") for k in cmd.get("env", {}))
            if cmd["argv"][:1] == [IOTUNE] and not starts:
                try:
                    with _Watch(d, cmd["argv"]):
                        res = _forked(cmd)
                except OSError as exc:
                    res = {"rc": -2, "stdout": "", "stderr": str(exc)}
                out = os.path.join(d, "res-" + name[4:])
                with open(out + ".tmp", "w") as fh:
                    json.dump(res, fh)
                os.rename(out + ".tmp", out)
                continue
            watch = _Watch(d, cmd["argv"])
            try:
                p = subprocess.run(
                    cmd["argv"],
                    input=cmd.get("input"),
                    capture_output=True,
                    text=True,
                    timeout=cmd.get("timeout", 120),
                    env={**os.environ, **cmd.get("env", {})},
                    check=False,
                )
                res = {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}
            except subprocess.TimeoutExpired as exc:
                res = {"rc": -9, "stdout": str(exc.stdout or ""), "stderr": "timeout"}
            except OSError as exc:
                res = {"rc": -2, "stdout": "", "stderr": str(exc)}
            finally:
                watch.stop.set()
            out = os.path.join(d, "res-" + name[4:])
            with open(out + ".tmp", "w") as fh:
                json.dump(res, fh)
            os.rename(out + ".tmp", out)


if __name__ == "__main__":
    main()
