"""A worker for tests/unit/test_zygote.py: says what it was given, then does what argv asks."""

import json
import os
import signal
import sys
import time

from iotune.workers import forked

if __name__ == "__main__":
    if sys.argv[1] == "hang":
        # SIGTERM held back from before the ready line until the wait below: a signal that
        # comes as soon as the line is read waits for it, however late the worker gets there
        # (a handler installed after the line could miss one that comes before time.sleep)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    print(
        json.dumps(
            {
                "argv": sys.argv[1:],
                "env": os.environ.get("ZYGOTE_TEST"),
                "pid": os.getpid(),
                "cwd": os.getcwd(),
                "stdin": sys.stdin.readline().strip(),
                "forked": forked(),
                "nice": os.getpriority(os.PRIO_PROCESS, 0),
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
    if what == "hang" and signal.sigtimedwait({signal.SIGTERM}, 60) is not None:
        sys.exit(143)
    if what == "stubborn":  # starts a helper, then ignores SIGTERM (the helper does not)
        import subprocess

        helper = subprocess.Popen(["sleep", "60"])
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(helper.pid, flush=True)
        time.sleep(60)
