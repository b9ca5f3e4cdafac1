"""Worker start-up without the imports: a server that imported torch, DeepSpeed and
transformers once forks each worker from itself.

    python -m iotune.workers.zygote serve SOCKET      # imports, then serves until killed
    IOTUNE_ZYGOTE=SOCKET iotune study ...             # every worker forks from it

On most hosts a worker's imports take seconds, but where Python itself is slow (an emulated
guest, a virtualenv on a network filesystem) they take minutes, and a study starts two
workers per run. With ``IOTUNE_ZYGOTE`` naming a server's socket, iotune starts
``python -m iotune.workers.zygote client SOCKET MODULE ARGS...`` where it would have started
``python -m MODULE ARGS...``: the client hands its stdin, stdout, stderr, environment and
working directory over the socket, the server forks a child that takes them and runs MODULE
as ``__main__``, and the client stays in its place (the tracer's process group, its signals,
its exit code) until the child ends:

- the child's pid goes to the tracer as a ``{"event": "process"}`` line in ``$IOTUNE_EVENTS``
  before the child starts, so its I/O is the workload's as a forked child's is;
- SIGINT and SIGTERM to the client are passed to the child; the client gets SIGTERM when
  the process that started it dies (iotune killed with SIGKILL); the child ends when the
  client's connection closes (the client was killed): SIGTERM to the child's process group
  (the child leads one of its own, with any helper process it starts), SIGKILL to it
  KILL_AFTER_S later if it is still there, as the tracer does to a workload it started;
- the server waits for the child and sends its wait status; the client exits with the
  child's exit code (128 + N for a signal N, as a shell reports it);
- a client that finds no server at SOCKET (its zygote was killed and left the socket file)
  says so in one line on stderr and runs MODULE in its own process, as ``python -m`` would.

The server also loads DeepSpeed's CPU Adam, async I/O and shared-memory ops (building them
first where they are not built), so a worker's loads of them return at once; a worker
whose ``TORCH_EXTENSIONS_DIR``, ``DS_ACCELERATOR`` (unset: the accelerator DeepSpeed
chose), ``CXX`` or ``PYTHONPATH`` differs from the server's loads its own. It keeps
DeepSpeed's table of the ops this host can build for them too (``deepspeed.ops``), which
each worker's communication backend reads as it starts. The server forks from a process
that has imported and loaded but never computed: no thread, no OpenMP pool, no accelerator
state is inherited.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

PRELOAD = ("torch", "deepspeed", "transformers.models.llama.modeling_llama")
#: imported too where this DeepSpeed has them: deepspeed.initialize imports the Muon
#: optimizer to check the optimizer it is given, and that module wraps functions in
#: torch.compile at import, which imports torch's inductor (36 s of a 54 s initialisation
#: in an emulated guest, in every worker)
OPTIONAL = ("deepspeed.runtime.zero.muon.muon_optimizer",)
#: DeepSpeed's ops the workers load (CPU Adam, async I/O, and the CPU accelerator's shared
#: memory collectives), loaded here too (built first where they are not): a worker's own load
#: of one then returns DeepSpeed's cached module, where it would load it again (seconds
#: each, minutes in an emulated guest, twice a run: the run's op check and its engine)
OPS = ("CPUAdamBuilder", "AsyncIOBuilder", "ShareMemCommBuilder")
#: the variables that decide which build of an op a load finds: a worker whose environment
#: differs in one of them loads its own
OPS_ENV = ("TORCH_EXTENSIONS_DIR", "DS_ACCELERATOR", "CXX", "PYTHONPATH")
#: OPS_ENV as the server loaded the ops (empty: it loaded none)
_ops_env: dict[str, str | None] = {}
FDS = 3  # stdin, stdout, stderr
#: how long a child whose client has gone may take to end on SIGTERM before SIGKILL
KILL_AFTER_S = 10.0


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return buf
        buf += chunk
    return buf


def _send_msg(conn: socket.socket, obj: Any) -> None:
    data = json.dumps(obj).encode()
    conn.sendall(len(data).to_bytes(4, "big") + data)


def _recv_msg(conn: socket.socket) -> Any:
    head = _recv_exact(conn, 4)
    if len(head) < 4:
        return None
    return json.loads(_recv_exact(conn, int.from_bytes(head, "big")))


# ------------------------------------------------------------------ the server


def serve(path: str, preload: tuple[str, ...]) -> None:
    import importlib

    t0 = time.monotonic()
    for name in preload:
        importlib.import_module(name)
    ops = ""
    if preload == PRELOAD:
        for name in OPTIONAL:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        ops = _preload_ops()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".tmp")
    srv.listen(16)
    os.rename(path + ".tmp", path)  # the socket appears once the server answers
    sys.stderr.write(
        f"zygote: {', '.join(preload)} imported in {time.monotonic() - t0:.1f} s{ops}\n"
    )
    sys.stderr.flush()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    while True:
        conn, _ = srv.accept()
        if os.fork() == 0:
            srv.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _child(conn)  # never returns
        conn.close()


def _preload_ops() -> str:
    """Load OPS (building what is not built) in the environment the workers get, so that
    the server builds with the workers' ninja and cache; what was loaded, for the log. An op
    that cannot be built or loaded here is left to the worker, whose run reports it."""
    from iotune.proc import worker_env
    from iotune.workers import cpu_info_once
    from iotune.workers.built_ops import load_quietly

    os.environ.update(worker_env())
    cpu_info_once()  # asked here while the ops load: the forks keep the answer
    took = load_quietly(OPS, build=True)
    if not took:
        return "; no DeepSpeed op loaded"
    _compatible_ops_once()  # in the ops' environment: a worker in another forgets both
    _ops_env.update(_env_of_ops())
    return "; ops loaded: " + ", ".join(f"{n} {s:.1f} s" for n, s in took.items())


def _compatible_ops_once() -> None:
    """DeepSpeed's table of the ops this host can build (``deepspeed.ops.__compatible_ops__``),
    worked out here once for every fork: its communication backend reads it as each worker
    initialises (whether to load the shared-memory op), and working it out compiles and links
    a test program for each op that needs a library (async_io's libaio), seconds of every
    worker's start on an emulated CPU. Left to the worker where it fails here, and with a GPU
    accelerator: its builders' checks ask the GPU (its compute capability), and a GPU a
    process has initialised cannot be used by the processes it forks."""
    try:
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator

        if get_accelerator().device_name() != "cpu":
            return
        deepspeed.ops.__compatible_ops__  # noqa: B018 - computed and kept on first access
    except Exception:  # noqa: BLE001, S110 - the worker asks again and meets the failure
        pass


def _env_of_ops() -> dict[str, str | None]:
    """OPS_ENV as it decides which builds of the ops a process loads. DS_ACCELERATOR unset
    is the accelerator DeepSpeed chose on its import, the one the server's ops are built
    for: a server started without it and a worker given it by its run (``cpu`` on a host
    without a GPU, as iotune's runs set it) load the same builds."""
    env = {k: os.environ.get(k) for k in OPS_ENV}
    if not env["DS_ACCELERATOR"]:
        with contextlib.suppress(Exception):
            from deepspeed.accelerator import get_accelerator

            env["DS_ACCELERATOR"] = get_accelerator().device_name()
    return env


def _forget_ops_unless_same_env() -> None:
    """In a worker whose environment would find other builds of the ops than the server
    loaded: forget them, so that its own load finds its own."""
    if not _ops_env or _ops_env == _env_of_ops():
        return
    # the compatibility table too: a compiler or library flags of its own answer otherwise
    ops = sys.modules.get("deepspeed.ops")
    if ops is not None:
        vars(ops).pop("__compatible_ops__", None)
    # DeepSpeed's builders import as deepspeed.ops.op_builder and as op_builder: a cache each
    for name, module in list(sys.modules.items()):
        if name.endswith("op_builder.builder"):
            getattr(getattr(module, "OpBuilder", None), "_loaded_ops", {}).clear()


def _child(conn: socket.socket) -> None:
    """One connection: fork the worker, hold it until the client says go, then wait for it
    (or kill it when the client goes away) and send its exit status."""
    code = 1
    try:
        msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, FDS)
        req = json.loads(msg)
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            conn.close()
            os.close(go_w)
            _worker(req, fds, go_r)  # never returns
        os.close(go_r)
        with contextlib.suppress(OSError):  # the child does the same: whichever runs first
            os.setpgid(pid, pid)
        for fd in fds:
            os.close(fd)
        _send_msg(conn, {"pid": pid})
        if _recv_msg(conn) == "go":
            os.write(go_w, b"g")
        os.close(go_w)
        status = _wait(conn, pid)
        _send_msg(conn, {"status": status})
        code = 0
    finally:
        os._exit(code)


def _wait(conn: socket.socket, pid: int) -> int:
    """The worker's wait status; SIGTERM to its process group when the client's connection
    closes, SIGKILL KILL_AFTER_S later."""
    import select

    pidfd = os.pidfd_open(pid)
    poll = select.poll()
    poll.register(pidfd, select.POLLIN)
    poll.register(conn.fileno(), select.POLLIN)
    kill_at: float | None = None
    while True:
        left = None if kill_at is None else max(0, int(1000 * (kill_at - time.monotonic())))
        events = poll.poll(left)
        if not events and kill_at is not None:
            _signal_group(pid, signal.SIGKILL)  # it did not end on SIGTERM
            kill_at = None
        for fd, _ev in events:
            if fd == pidfd:
                return os.waitpid(pid, 0)[1]
            if not conn.recv(1, socket.MSG_PEEK):  # the client is gone
                _signal_group(pid, signal.SIGTERM)
                kill_at = time.monotonic() + KILL_AFTER_S
                poll.unregister(conn.fileno())


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _worker(req: dict[str, Any], fds: list[int], go: int) -> None:
    from iotune.workers import mark_forked

    mark_forked()
    code = 1
    try:
        os.setpgid(0, 0)  # a group of its own: the server's signals reach its helpers too
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        # named in ps and top by its module, not the server's "python" (the kernel keeps
        # 15 bytes): iot-train, iot-persist
        with contextlib.suppress(OSError):
            Path("/proc/self/comm").write_text(worker_name(req["module"]))
        _forget_ops_unless_same_env()
        os.chdir(req["cwd"])
        if "nice" in req:
            os.setpriority(os.PRIO_PROCESS, 0, int(req["nice"]))
        if os.read(go, 1) != b"g":
            os._exit(1)
        os.close(go)
        code = _run_module(req["module"], req["args"])
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def worker_name(module: str) -> str:
    """A forked worker's process name: ``iot-`` and its module's last part, in the 15 bytes
    the kernel keeps."""
    return f"iot-{module.rsplit('.', 1)[-1]}"[:15]


def _run_module(module: str, args: list[str]) -> int:
    """Run *module* as ``__main__`` with *args*, as ``python -m`` would; its exit code."""
    import runpy
    import traceback

    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        sys.stderr.write(f"{exc.code}\n")
        return 1
    except BaseException:  # noqa: BLE001 (the worker's own failure, printed as python would)
        traceback.print_exc()
        return 1
    return 0


# ------------------------------------------------------------------ the client


def client(path: str, module: str, args: list[str]) -> int:
    from iotune.workers import die_with_parent

    # iotune killed (kill -9): the client gets SIGTERM and passes it to the worker, which
    # would otherwise go on training in the zygote's process tree
    die_with_parent()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as e:  # a socket left by a zygote that has gone, or not a socket at all
        sys.stderr.write(
            f"iotune zygote: no server at {path} ({e.strerror or e}); "
            f"{module} runs in this process\n"
        )
        sys.stderr.flush()
        return _run_module(module, args)
    # the worker runs at this process's CPU priority, as a worker started here would
    # (`nice iotune run ...`), not at the server's
    req: dict[str, Any] = {
        "module": module,
        "args": args,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }
    socket.send_fds(conn, [json.dumps(req).encode()], [0, 1, 2])
    hello = _recv_msg(conn)
    if not isinstance(hello, dict) or "pid" not in hello:
        sys.stderr.write(f"iotune zygote: no answer from {path}\n")
        return 1
    pid = int(hello["pid"])
    events = os.environ.get("IOTUNE_EVENTS")
    if events:
        with open(events, "a") as fh:
            fh.write(json.dumps({"event": "process", "pid": pid}) + "\n")

    def forward(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    _send_msg(conn, "go")
    end = _recv_msg(conn)
    if not isinstance(end, dict) or not isinstance(end.get("status"), int):
        sys.stderr.write(f"iotune zygote: the server at {path} went away\n")
        return 1
    code = os.waitstatus_to_exitcode(end["status"])  # -N for a signal N
    return 128 - code if code < 0 else code


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "serve":
        preload = tuple(argv[2].split(",")) if len(argv) > 2 else PRELOAD
        serve(argv[1], preload)
        return 0
    if len(argv) >= 3 and argv[0] == "client":
        return client(argv[1], argv[2], argv[3:])
    sys.stderr.write(
        "usage: python -m iotune.workers.zygote serve SOCKET [MODULE,...]\n"
        "       python -m iotune.workers.zygote client SOCKET MODULE [ARGS...]\n"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
