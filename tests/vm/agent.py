"""Runs inside the QEMU guest: executes commands the host drops into a shared directory.

Protocol (files in DIR, written atomically with rename): the host writes ``cmd-N.json``
(``{"argv": [...], "timeout": s, "input": str|null}``); the agent runs it without a shell
and writes ``res-N.json`` (``{"rc", "stdout", "stderr"}``); ``"env"`` adds variables,
``"background": true`` with ``"log": PATH`` starts it without waiting (its pid is the stdout). ``ready`` appears once the
agent runs; ``{"argv": ["__exit__"]}`` ends it (and the guest).
"""

import json
import os
import subprocess
import sys
import time


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
