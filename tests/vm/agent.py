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


def _warm_up() -> None:
    """iotune's command line and every command's module, imported once."""
    if _WARM:
        return
    from iotune.cli import app

    for where in app.COMMANDS.values():
        module = "iotune.cli." + where.split(":")[0]
        importlib.import_module(module)
        _WARM.add(module)


def _child(argv: list[str], env: dict[str, str], stdin: str, out: str, err: str) -> None:
    """In the forked child: the command's files as fds 0-2, then iotune's main(); exits as
    the interpreter would (threads joined, atexit run, streams flushed)."""
    code = 1
    try:
        for fd, path, mode in (
            (0, stdin, os.O_RDONLY),
            (1, out, os.O_WRONLY),
            (2, err, os.O_WRONLY),
        ):
            f = os.open(path, mode)
            os.dup2(f, fd)
            os.close(f)
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
        for t in threading.enumerate():
            if t is not threading.main_thread() and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _forked(cmd: dict[str, Any]) -> dict[str, Any]:
    """An ``iotune`` command run in a child forked from the warm agent."""
    _warm_up()
    tmp = tempfile.mkdtemp(prefix="agent-")
    out, err, inp = (os.path.join(tmp, n) for n in ("out", "err", "in"))
    for path in (out, err):
        open(path, "w").close()
    if cmd.get("input") is not None:
        with open(inp, "w") as fh:
            fh.write(cmd["input"])
    else:
        inp = os.devnull
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(cmd["argv"], cmd.get("env", {}), inp, out, err)
    deadline = time.monotonic() + cmd.get("timeout", 120)
    rc = None
    while rc is None:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = os.waitstatus_to_exitcode(status)
        elif time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            rc = -9
        else:
            time.sleep(0.02)
    with open(out, errors="replace") as fh:
        stdout = fh.read()
    with open(err, errors="replace") as fh:
        stderr = fh.read() if rc != -9 else "timeout"
    for path in (out, err, inp):
        if path.startswith(tmp):
            os.unlink(path)
    os.rmdir(tmp)
    return {"rc": rc, "stdout": stdout, "stderr": stderr}


def main() -> None:
    d = sys.argv[1]
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
            time.sleep(idle)
            idle = min(0.5, idle * 1.5)
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
            if cmd["argv"][:1] == [IOTUNE]:
                res = _forked(cmd)
                out = os.path.join(d, "res-" + name[4:])
                with open(out + ".tmp", "w") as fh:
                    json.dump(res, fh)
                os.rename(out + ".tmp", out)
                continue
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
            out = os.path.join(d, "res-" + name[4:])
            with open(out + ".tmp", "w") as fh:
                json.dump(res, fh)
            os.rename(out + ".tmp", out)


if __name__ == "__main__":
    main()
