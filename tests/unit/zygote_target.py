"""A worker for tests/unit/test_zygote.py: says what it was given, then does what argv asks."""

import json
import os
import signal
import sys
import time

from iotune.workers import forked

if __name__ == "__main__":
    print(
        json.dumps(
            {
                "argv": sys.argv[1:],
                "env": os.environ.get("ZYGOTE_TEST"),
                "pid": os.getpid(),
                "cwd": os.getcwd(),
                "stdin": sys.stdin.readline().strip(),
                "forked": forked(),
            }
        ),
        flush=True,
    )
    print("to stderr", file=sys.stderr, flush=True)
    what = sys.argv[1]
    if what == "exit":
        sys.exit(int(sys.argv[2]))
    if what == "raise":
        raise RuntimeError("the worker's own failure")
    if what == "hang":
        signal.signal(signal.SIGTERM, lambda s, f: sys.exit(143))
        time.sleep(60)
    if what == "stubborn":  # starts a helper, then ignores SIGTERM (the helper does not)
        import subprocess

        helper = subprocess.Popen(["sleep", "60"])
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(helper.pid, flush=True)
        time.sleep(60)
