"""What a traced training script ran with, told by the script's own processes.

`iotune trace -- COMMAND` puts this folder first on the command's PYTHONPATH and names a
folder in $IOTUNE_LEARN; Python's site module imports ``sitecustomize`` at every start of
an interpreter, so every Python process the command starts (a launcher, its ranks) runs
this, as coverage.py measures subprocesses. It imports nothing beyond the standard library
and does nothing until the process itself imports DeepSpeed: an import hook waits for
``deepspeed.runtime.engine`` and ``deepspeed.runtime.zero.partition_parameters`` and wraps,
once they are loaded:

- ``DeepSpeedEngine._configure_distributed_model``, which every engine runs once its config
  is resolved and before its optimizer exists (``deepspeed.initialize``, accelerate's
  ``prepare``, the Trainer's ``deepspeed_init`` all build one): each rank writes
  ``engine-rank{R}.json`` (world size, micro-batch, accumulation, dtype, where its swap files
  go), rank 0 also the config DeepSpeed resolved (the Trainer's and accelerate's "auto"
  values filled) and the model's parameter tensors;
- ``zero.Init.__init__`` where it swaps parameters to NVMe: ``init-rank{R}.json`` (where
  the parameter files go) before the first is written.

After each file the process waits (at most WAIT_S) for iotune's ``.go`` beside it: iotune
watches the swap folder from then on, before DeepSpeed's first write there. Any failure in
here is written to ``error-rank{R}-{pid}.txt`` and the program goes on as if this module
were not there. The ``sitecustomize`` this one hides on sys.path (a distribution's own) is
run after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

ENV = "IOTUNE_LEARN"
#: seconds a process waits for iotune to have read what it wrote
WAIT_S = 120.0
_POLL_S = 0.005
_ENGINE = "deepspeed.runtime.engine"
_ZERO_INIT = "deepspeed.runtime.zero.partition_parameters"
_seen: set[str] = set()


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _error(where: str, exc: BaseException) -> None:
    """One line for iotune to report; never raises."""
    with contextlib.suppress(Exception):  # this module never breaks the program
        folder = os.environ[ENV]
        text = str(exc).strip().splitlines()
        line = f"{where}: {type(exc).__name__}" + (f": {text[0]}" if text else "")
        name = os.path.join(folder, f"error-rank{_rank()}-{os.getpid()}.txt")
        with open(name, "a", encoding="utf-8") as fh:
            fh.write(line[:500] + "\n")


def _write(name: str, doc: dict[str, Any]) -> str:
    folder = os.environ[ENV]
    path = os.path.join(folder, name)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, default=str)
    os.replace(tmp, path)  # whole or absent: iotune never reads half of it
    return path


def _wait_for_iotune(path: str) -> None:
    go = path[: -len(".json")] + ".go"
    deadline = time.monotonic() + WAIT_S
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def _world() -> dict[str, Any]:
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1") or 1)
    dist = sys.modules.get("deepspeed.comm")
    with contextlib.suppress(Exception):  # the environment's figure stands
        if dist is not None and dist.is_initialized():
            world = int(dist.get_world_size())
    local = env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE") or str(world)
    return {
        "rank": _rank(),
        "local_rank": int(env.get("LOCAL_RANK", "0") or 0),
        "world_size": world,
        "local_world_size": int(local),
        "pid": os.getpid(),
        # DeepSpeed's CPU allreduce names its /dev/shm workspaces by it (iotune removes them)
        "master_port": env.get("MASTER_PORT"),
        "cwd": os.getcwd(),
        "argv": list(sys.argv),
    }


def _accelerator() -> str | None:
    acc = sys.modules.get("deepspeed.accelerator")
    try:
        return str(acc.get_accelerator().device_name()) if acc is not None else None
    except Exception:  # noqa: BLE001 - not said, then
        return None


def _device(off: Any) -> str:
    dev = getattr(off, "device", None) if off is not None else None
    return str(getattr(dev, "value", dev) or "none")


def _numel(p: Any) -> int:
    # ZeRO-3 keeps a partition on each rank: ds_numel is the whole tensor's
    n = getattr(p, "ds_numel", None)
    return int(n) if n is not None else int(p.numel())


def _shape(p: Any) -> list[int]:
    s = getattr(p, "ds_shape", None)
    return [int(x) for x in (s if s is not None else p.shape)]


def _model(module: Any) -> dict[str, Any]:
    """The model as iotune.workers.model_meta describes one built from its config.json:
    every parameter tensor in parameters() order, the tied ones, the config's sizes."""
    own = [[n, _numel(p), _shape(p)] for n, p in module.named_parameters()]
    names = {n for n, _, _ in own}
    try:
        every = list(module.named_parameters(remove_duplicate=False))
    except TypeError:  # a torch before 2.0
        every = []
    tied = [[n, _numel(p)] for n, p in every if n not in names]
    cfg = getattr(module, "config", None)
    config: dict[str, Any] = {}
    if cfg is not None and callable(getattr(cfg, "to_dict", None)):
        config = {
            k: v
            for k, v in cfg.to_dict().items()
            if k not in ("transformers_version", "_name_or_path", "torch_dtype", "dtype")
        }
    get_text = getattr(cfg, "get_text_config", None)
    text = get_text() if callable(get_text) else cfg
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    inter = getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None)
    heads = int(getattr(text, "num_attention_heads", 1) or 1)
    return {
        "model_type": getattr(cfg, "model_type", None),
        "architecture": type(module).__name__,
        "config": config,
        "tensors": own,
        "tied": tied,
        "frozen": sum(_numel(p) for _, p in module.named_parameters() if not p.requires_grad),
        "hidden_size": hidden,
        "intermediate_size": int(inter) if inter else 4 * hidden,
        "num_hidden_layers": int(getattr(text, "num_hidden_layers", 1) or 1),
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(text, "num_key_value_heads", None) or heads),
        "vocab_size": int(getattr(text, "vocab_size", 0) or 0),
        "max_position_embeddings": int(getattr(text, "max_position_embeddings", 0) or 0),
    }


def _engine_seen(engine: Any) -> None:
    if "engine" in _seen:  # a second engine in one process (a reference model) is not it
        return
    _seen.add("engine")
    c = engine._config
    zc = c.zero_config
    oo, op = zc.offload_optimizer, zc.offload_param
    doc = _world()
    doc.update(
        {
            "source": "engine",
            "world_size": int(getattr(engine, "world_size", doc["world_size"])),
            "rank": int(getattr(engine, "global_rank", doc["rank"])),
            "dp_world_size": int(getattr(engine, "dp_world_size", doc["world_size"])),
            "micro_batch": int(engine.train_micro_batch_size_per_gpu()),
            "ga": int(engine.gradient_accumulation_steps()),
            "train_batch_size": int(engine.train_batch_size()),
            "dtype": "bf16"
            if engine.bfloat16_enabled()
            else "fp16"
            if engine.fp16_enabled()
            else "fp32",
            "zero_stage": int(zc.stage),
            "offload_optimizer": _device(oo),
            "offload_param": _device(op),
            "optimizer_nvme_path": str(oo.nvme_path) if _device(oo) == "nvme" else None,
            "param_nvme_path": str(op.nvme_path) if _device(op) == "nvme" else None,
            "deepspeed": getattr(sys.modules.get("deepspeed"), "__version__", None),
            "accelerator": _accelerator(),
        }
    )
    if doc["rank"] == 0:
        doc["config"] = c._param_dict
        doc["model"] = _model(engine.module)
    _wait_for_iotune(_write(f"engine-rank{doc['rank']}.json", doc))


def _init_config(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """zero.Init's config_dict_or_path (or its deprecated config), as a dict where it is one
    or names a JSON file."""
    cfg = kwargs.get("config_dict_or_path", kwargs.get("config"))
    if cfg is None and len(args) > 5:  # module, group, linear, remote_device, pin_memory, cfg
        cfg = args[5]
    if isinstance(cfg, (str, os.PathLike)):
        with open(cfg, encoding="utf-8") as fh:
            cfg = json.load(fh)
    return cfg if isinstance(cfg, dict) else None


def _zero_init_seen(init: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    swapper = getattr(init, "param_swapper", None)
    if swapper is None or "init" in _seen:
        return
    _seen.add("init")
    doc = _world()
    cfg = _init_config(args, kwargs) or {}
    zo = cfg.get("zero_optimization") or {}
    oo = zo.get("offload_optimizer") or {}
    doc.update(
        {
            "source": "zero.Init",
            "offload_param": "nvme",
            "param_nvme_path": str(swapper.swap_config.nvme_path),
            "offload_optimizer": str(oo.get("device") or "none"),
            "optimizer_nvme_path": oo.get("nvme_path") if oo.get("device") == "nvme" else None,
        }
    )
    _wait_for_iotune(_write(f"init-rank{doc['rank']}.json", doc))


def _wrap_after(cls: Any, name: str, then: Any, with_args: bool = False) -> None:
    orig = getattr(cls, name)

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = orig(self, *args, **kwargs)
        try:
            then(self, args, kwargs) if with_args else then(self)
        except Exception as exc:  # noqa: BLE001 - reported by iotune, never raised here
            _error(f"{cls.__name__}.{name}", exc)
        return result

    wrapped.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapped.__name__ = getattr(orig, "__name__", name)
    wrapped.__doc__ = getattr(orig, "__doc__", None)
    setattr(cls, name, wrapped)


def _loaded(name: str, module: Any) -> None:
    try:
        if name == _ENGINE:
            _wrap_after(module.DeepSpeedEngine, "_configure_distributed_model", _engine_seen)
        elif name == _ZERO_INIT:
            _wrap_after(module.Init, "__init__", _zero_init_seen, with_args=True)
    except Exception as exc:  # noqa: BLE001 - another DeepSpeed: said, not raised
        _error(f"wrapping {name}", exc)


class _Loader:
    """The module's own loader, which tells us once the module has run."""

    def __init__(self, name: str, loader: Any) -> None:
        self.name = name
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # the module keeps its own loader (inspect, importlib.resources read it)
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _loaded(self.name, module)


class _Finder:
    """A meta path finder for the two DeepSpeed modules alone: it finds them as the rest of
    sys.meta_path does and hands back their own spec with _Loader in front."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in (_ENGINE, _ZERO_INIT):
            return None
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(name, spec.loader)
                    return spec
        except Exception as exc:  # noqa: BLE001 - the import goes on without us
            _error(f"finding {name}", exc)
        return None


def _chain() -> None:
    """Run the sitecustomize this module hides (Debian's installs apport's hook)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.realpath(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _install() -> None:
    folder = os.environ.get(ENV)
    if folder and os.path.isdir(folder):
        sys.meta_path.insert(0, _Finder())  # type: ignore[arg-type]


try:
    _install()
except Exception as _exc:  # noqa: BLE001 - never break the interpreter's start
    _error("installing", _exc)
try:
    _chain()
except Exception as _exc:  # noqa: BLE001 - said as site.py says it, had it found that one
    print(
        f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(_exc).__name__}: {_exc}",
        file=sys.stderr,
    )
