"""Worker: DeepSpeed training steps of a causal LM built from scratch (a Llama preset or a

    python -m iotune.workers.train SPEC.json

SPEC (written by iotune.train.runner) holds the model config (model_type, geometry), the DeepSpeed config,
micro-batch, sequence length, steps, data and the run directory. The worker appends one JSON
line per event to ``$IOTUNE_EVENTS`` (the tracer samples its counters there) and to
``steps.jsonl`` in the run directory:

    {"event": "ready"}                  after the imports and the process group: the training's
                                        own I/O starts here (what the interpreter read to load
                                        torch, DeepSpeed and transformers is not the training's)
    {"event": "init", "step": 0, ...}   after deepspeed.initialize (engine and swap files built)
    {"event": "step", "step": n, ...}   after each optimizer step (forward/backward/optimizer s,
                                        tokens/s, loss, peak accelerator memory, host RSS,
                                        bytes of swap files on the NVMe path)

Times are taken with the accelerator synchronised before each clock read, as DeepSpeed's
own SynchronizedWallClockTimer does, so the optimizer-step time includes the NVMe swaps.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from iotune.trace.acks import AckWaiter
from iotune.workers import cpu_info_once, die_with_parent, fastpersist, forked, stdout_to_stderr
from iotune.workers.checkpoints import RunFails, StepLosses, resume, save_checkpoint
from iotune.workers.model_build import build_partitioned, model_config
from iotune.workers.persist import Persister
from iotune.workers.torch_probe import cpu_bf16


class SwapClock:
    """Seconds DeepSpeed's optimizer swapper spends in its swaps, per step: writing the fp32
    gradients at the accumulation boundary (``swap_out_gradients``, which waits when its
    buffers are full: ``grad_out_s`` inside the boundary's engine.step(),
    ``backward_grad_out_s`` where DeepSpeed's managed accumulation does it at the end of the
    last backward), reading a sub-group's state in (``swap_in_optimizer_state``, which first
    waits for the gradients still being written: ``_flush_gradient_swapper``, timed apart as
    well) and writing it out (``swap_out_optimizer_state``). What is left of the optimizer
    step is CPU Adam and the copies around it: a run with its state on NVMe times both, as a
    RAM run times the one."""

    def __init__(self, engine: Any) -> None:
        self.spent = dict.fromkeys(
            ("grad_out_s", "backward_grad_out_s", "swap_in_s", "swap_out_s", "grad_flush_s"), 0.0
        )
        self.on = False
        #: inside the boundary's engine.step(): DeepSpeed writes the gradients there, or, with
        #: its managed accumulation, at the end of the last micro-step's backward
        self.stepping = False
        swapper = getattr(getattr(engine, "optimizer", None), "optimizer_swapper", None)
        if swapper is None:
            return
        for attr, key in (
            ("swap_out_gradients", "grad_out_s"),
            ("swap_in_optimizer_state", "swap_in_s"),
            ("swap_out_optimizer_state", "swap_out_s"),
            ("_flush_gradient_swapper", "grad_flush_s"),
        ):
            if hasattr(swapper, attr):
                setattr(swapper, attr, self._timed(getattr(swapper, attr), key))
                self.on = True

    def _timed(self, fn: Any, key: str) -> Any:
        def timed(*args: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                k = key if self.stepping or key != "grad_out_s" else "backward_grad_out_s"
                self.spent[k] += time.perf_counter() - t

        return timed

    def take(self) -> dict[str, float]:
        """The seconds since the last take (nothing where DeepSpeed swaps no optimizer
        state); swap_in_s includes grad_flush_s."""
        out = {k: round(v, 4) for k, v in self.spent.items()} if self.on else {}
        self.spent = dict.fromkeys(self.spent, 0.0)
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss() -> tuple[int, int]:
    """(current, peak) resident set size of this process in bytes, from /proc/self/status."""
    cur = peak = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    return cur, peak


def _proc_io() -> dict[str, int]:
    """Bytes this process (all its threads, DeepSpeed's AIO threads among them) had read from
    and written to storage, from /proc/self/io: O_DIRECT I/O is counted when submitted."""
    out = {}
    try:
        with open("/proc/self/io") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                if k in ("read_bytes", "write_bytes"):
                    out[k] = int(v)
    except OSError:  # a kernel without task I/O accounting
        return {}
    return out


def swap_bytes(path: str | None, rank: int | None = None) -> dict[str, int]:
    """Allocated and apparent bytes of every file under the swap directory, or of the files
    of one rank: DeepSpeed keeps each rank's under a ``rank<r>`` folder
    (swap_tensor/optimizer_utils.py, partitioned_param_swapper.py)."""
    alloc = apparent = files = 0
    own = f"rank{rank}"
    if path and os.path.isdir(path):
        for root, _dirs, names in os.walk(path):
            if rank is not None and own not in Path(root).relative_to(path).parts:
                continue
            for n in names:
                try:
                    st = os.stat(os.path.join(root, n))
                except FileNotFoundError:
                    continue  # DeepSpeed removed it meanwhile
                alloc += st.st_blocks * 512
                apparent += st.st_size
                files += 1
    return {"allocated": alloc, "apparent": apparent, "files": files}


class Events:
    """Every rank appends its own lines, tagged with its rank, to the same files: one
    write(2) of a short line to a file opened with O_APPEND does not interleave."""

    def __init__(self, run_dir: Path, rank: int, node: str) -> None:
        self.steps = run_dir / "steps.jsonl"
        traced = os.environ.get("IOTUNE_EVENTS")
        self.traced = Path(traced) if traced else None
        self.tag = {"rank": rank, "node": node}
        # each rank waits after each event until the tracer has sampled it, through a FIFO
        # of its own (iotune/trace/acks.py)
        self.acks = AckWaiter.from_env() if self.traced else None

    def emit(self, rec: dict[str, Any]) -> None:
        rec = {**rec, **self.tag}
        _append(self.steps, rec)
        if self.traced is None:
            return
        acks = self.acks if self.acks is not None and self.acks.active else None
        _append(self.traced, rec if acks is None else {**rec, "ack": acks.local_rank})
        if acks is not None:
            acks.wait()


def _append(path: Path, rec: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(rec) + "\n")
        fh.flush()  # no fsync: the tracer reads the page cache, and the run directory may
        # sit on the traced drive


def batches(spec: dict[str, Any], vocab: int) -> Iterator[Any]:
    """Micro-batches of token ids: synthetic (seeded) or from the packed data file."""
    import torch

    mb, seq = int(spec["micro_batch"]), int(spec["seq_len"])
    data = spec.get("data")
    if not data:
        gen = torch.Generator().manual_seed(int(spec.get("seed", 0)))
        while True:
            yield torch.randint(0, vocab, (mb, seq), generator=gen)
    import numpy as np

    blocks = np.load(data["blocks"], mmap_mode="r")  # [n_blocks, seq] int32, packed by the CLI
    i = 0
    while True:
        rows = [(i + k) % len(blocks) for k in range(mb)]
        i += mb
        yield torch.from_numpy(np.asarray(blocks[rows], dtype=np.int64))


def rank_swap_dir(spec: dict[str, Any], local_rank: int) -> str | None:
    """This rank's offload directory (the spec lists one per rank of the node), or None
    without NVMe offload."""
    dirs = spec["swap_dirs"]
    return str(dirs[local_rank % len(dirs)]) if dirs else None


def with_nvme_path(ds_config: dict[str, Any], path: str | None) -> dict[str, Any]:
    """The DeepSpeed config with every NVMe offload pointed at *path*."""
    if path is None:
        return ds_config
    cfg: dict[str, Any] = json.loads(json.dumps(ds_config))
    zo = cfg.get("zero_optimization", {})
    for k in ("offload_optimizer", "offload_param"):
        if zo.get(k, {}).get("device") == "nvme":
            zo[k]["nvme_path"] = path
    return cfg


def main() -> None:
    stdout_to_stderr()
    spec = json.loads(Path(sys.argv[-1]).read_text())
    rank = int(os.environ.get("RANK", "0"))
    events = Events(Path(spec["run_dir"]), rank, socket.gethostname())
    try:
        train(spec, events, rank)
    except RunFails as exc:
        # a refusal of iotune's own (a resumed run whose loss does not continue): one line
        events.emit({"event": "error", "error": str(exc)})
        os.write(2, f"iotune training worker: {exc}\n".encode())
        os._exit(1)
    except Exception as exc:
        # the cause goes into the run's record (a failed study run names it); the
        # traceback still goes to stderr
        lines = str(exc).strip().splitlines()
        events.emit(
            {"event": "error", "error": f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]}
        )
        raise


def train(spec: dict[str, Any], events: Events, rank: int) -> None:
    """Build the model and the DeepSpeed engine, then run the steps, emitting events."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("DS_ACCELERATOR", spec["accelerator"])
    for k, v in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        # DeepSpeed's launcher sets these; its fast and decoupled checkpoint writers read them
        # (runtime/model_checkpointing/utils.py): one node
        "CROSS_RANK": "0",
        "CROSS_SIZE": "1",
    }.items():
        os.environ.setdefault(k, v)
    t_start = time.perf_counter()
    cpu_info_once()

    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    # imports transformers: part of the imports the "ready" event reports, before any I/O
    # of the training's own
    mcfg, model_class = model_config(spec["model"])
    acc = get_accelerator()
    cuda = acc.device_name() == "cuda"
    if cuda:
        torch.cuda.set_device(local_rank)
    torch.manual_seed(int(spec.get("seed", 0)))
    if spec.get("cpu_threads"):
        torch.set_num_threads(int(spec["cpu_threads"]))
    deepspeed.init_distributed(dist_backend=acc.communication_backend_name(), verbose=False)
    bf16 = bool(spec["ds_config"].get("bf16", {}).get("enabled", False))
    rss, rss_peak = _rss()
    events.emit(
        {
            "event": "ready",
            "dtype": "bf16" if bf16 else "fp32",
            # torch's own view of the CPU (oneDNN's native bf16, ATen's vector level)
            "cpu": None if cuda else cpu_bf16(torch, measure=False),
            "import_s": round(time.perf_counter() - t_start, 4),
            "pid": os.getpid(),
            "local_rank": local_rank,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "host_rss_bytes": rss,
            "host_rss_peak_bytes": rss_peak,
            "forked": forked(),
            "proc_io": _proc_io(),
        }
    )
    if "writer" in (spec["ds_config"].get("checkpoint") or {}):
        # DeepSpeed's fast and decoupled writers (on a CPU, their buffer locked by the aio
        # op; the decoupled one's process dying with this one)
        fastpersist.install()
    swap_dir = rank_swap_dir(spec, local_rank)
    ds_config = with_nvme_path(spec["ds_config"], swap_dir)
    stage = int(ds_config.get("zero_optimization", {}).get("stage", 0))
    dtype = torch.bfloat16 if bf16 else torch.float32
    if stage == 3 and spec.get("zero_init", True):
        model = build_partitioned(torch, deepspeed, mcfg, model_class, ds_config)
    else:
        # built on the device in its training dtype: no fp32 copy of the model in host RAM
        # (ZenFlow needs the model built this way: zero.Init's early partitioning defeats
        # its transposed 2-D weights)
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            with torch.device(acc.current_device_name()):
                model = model_class(mcfg)
        finally:
            torch.set_default_dtype(prev)
    if spec.get("gradient_checkpointing", True):
        model.gradient_checkpointing_enable(  # type: ignore[no-untyped-call]
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    engine, _opt, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=ds_config,
    )
    copy, aio = spec.get("swap_copy"), ds_config.get("aio")
    resumed, resume_copy, adam_restored = resume(engine, spec.get("resume"), copy, aio)
    acc.synchronize()
    now = time.perf_counter()
    swaps = SwapClock(engine)
    base = {"params": n_params, "swap": swap_bytes(swap_dir, rank), "swap_dir": swap_dir}
    rss, rss_peak = _rss()
    events.emit(
        {
            "event": "init",
            "step": 0,
            "init_s": round(now - t_start, 4),
            "host_rss_bytes": rss,
            "host_rss_peak_bytes": rss_peak,
            "proc_io": _proc_io(),
            "resumed_at": resumed,
            "resume_copy": [r.as_dict() for r in resume_copy],
            "adam_restored": adam_restored,
            **base,
        }
    )
    ga = int(ds_config.get("gradient_accumulation_steps", 1))
    tokens_per_step = ga * int(spec["micro_batch"]) * int(spec["seq_len"])
    it = batches(spec, int(mcfg.vocab_size))
    for _ in range(resumed * ga):  # the batches the checkpoint's steps trained on
        next(it)
    engine.train()
    ck = spec.get("checkpoint")
    if ck:
        ck = {**ck, "copy": copy, "aio": aio}
    step_losses = StepLosses(spec, rank, resumed, "bf16" if bf16 else "fp32")
    persister = Persister.for_rank(ck)
    with fastpersist.writer_ends(engine):
        for step in range(1, int(spec["steps"]) + 1):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            acc.synchronize()
            beside = persister is not None and persister.running()
            t0 = time.perf_counter()
            fwd = bwd = acc_step = 0.0
            losses = []
            for micro in range(ga):
                ids = next(it).to(engine.device)
                a = time.perf_counter()
                loss = engine(input_ids=ids, labels=ids).loss
                acc.synchronize()
                b = time.perf_counter()
                engine.backward(loss)
                acc.synchronize()
                c = time.perf_counter()
                fwd += b - a
                bwd += c - b
                losses.append(float(loss.detach().float().item()))
                if micro < ga - 1:
                    engine.step()  # not a boundary: DeepSpeed only accumulates here
                    acc.synchronize()
                    acc_step += time.perf_counter() - c
            s0 = time.perf_counter()
            swaps.stepping = True
            engine.step()  # the boundary: gradients reduced, optimizer runs (and swaps)
            acc.synchronize()
            swaps.stepping = False
            s1 = time.perf_counter()
            rss, rss_peak = _rss()
            events.emit(
                {
                    "event": "step",
                    "step": step,
                    "forward_s": round(fwd, 4),
                    "backward_s": round(bwd, 4),
                    "accumulate_s": round(acc_step, 4),
                    "optimizer_s": round(s1 - s0, 4),
                    **swaps.take(),
                    "step_s": round(s1 - t0, 4),
                    "tokens_per_s": round(tokens_per_step / (s1 - t0), 2),
                    "loss": round(sum(losses) / len(losses), 5),
                    "global_step": resumed + step,
                    "peak_accel_bytes": int(torch.cuda.max_memory_allocated()) if cuda else None,
                    "host_rss_bytes": rss,
                    "host_rss_peak_bytes": rss_peak,
                    "proc_io": _proc_io(),
                    **base,
                    "swap": swap_bytes(swap_dir, rank),
                    # a save's persist read the offload volume beside this step
                    **({"persist_beside": True} if beside else {}),
                }
            )
            step_losses.add(resumed + step, sum(losses) / len(losses), events)
            if ck and step % int(ck["every"]) == 0:
                save_checkpoint(engine, ck, resumed + step, step, events, acc, persister)
        last = persister.wait() if persister is not None else None  # the run ends persisted
        if last is not None:
            events.emit(last)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import deepspeed.comm as ds_comm

        ds_comm.barrier()  # no rank leaves while another is still in the last step


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    # the tracer forwards Ctrl-C (and turns SIGTERM into SIGINT's treatment): stop between
    # Python operations, record it, and exit like an interrupted program, without a traceback
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        die_with_parent()
        main()
    except KeyboardInterrupt:
        sys.stderr.write("iotune training worker: interrupted\n")
        sys.exit(130)
    # Every step is recorded (each event is written and closed as it is emitted) and every
    # rank has passed the final barrier: leave without the interpreter's teardown, where the
    # destructors of DeepSpeed's and gloo's C++ threads can abort a rank of a multi-rank run
    # after its work is done ("terminate called without an active exception", SIGABRT)
    sys.stderr.flush()
    os._exit(0)
