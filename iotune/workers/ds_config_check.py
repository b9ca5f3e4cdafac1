"""Worker: read a DeepSpeed JSON config with DeepSpeed's own code and report what the runtime
will use: the "aio" section through deepspeed.runtime.swap_tensor.aio_config.get_aio_config
(which silently ignores unknown keys: reported as "ignored"), "checkpoint.writer" through
deepspeed.runtime.model_checkpointing.config, and "zero_optimization"
through DeepSpeedZeroConfig (pydantic: wrong types and values are errors)."""

from __future__ import annotations

import os
from typing import Any

from iotune.workers import report_json_request


def check(cfg: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.swap_tensor.aio_config import AIO_DEFAULT_DICT, get_aio_config

    out: dict[str, Any] = {"errors": []}
    aio = cfg.get("aio")
    if aio is not None:
        out["aio_used"] = get_aio_config(cfg)
        # keys the runtime's get_aio_config never reads: DeepSpeed runs the config without
        # them, so they are advice, not errors
        out["ignored"] = sorted(set(aio) - set(AIO_DEFAULT_DICT))
        for k, v in aio.items():
            if k in AIO_DEFAULT_DICT and type(v) is not type(AIO_DEFAULT_DICT[k]):
                out["errors"].append(
                    f"aio.{k} = {v!r}: expected {type(AIO_DEFAULT_DICT[k]).__name__}"
                )
    writer = (cfg.get("checkpoint") or {}).get("writer")
    if writer is not None:
        from deepspeed.runtime.model_checkpointing.config import get_checkpoint_writer_config

        try:
            out["writer_used"] = get_checkpoint_writer_config(cfg["checkpoint"])
        except AssertionError as exc:  # DeepSpeed checks the writer's values with assert
            out["errors"].append(f"checkpoint.writer: {exc}")
    if "zero_optimization" in cfg:
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        try:
            z = DeepSpeedZeroConfig(**cfg["zero_optimization"])
            out["zero_stage"] = int(z.stage)
        except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError and friends
            out["errors"].extend(_lines("zero_optimization", exc))
    return out


def _lines(section: str, exc: Exception) -> list[str]:
    """One line per problem: pydantic's errors as KEY: message, anything else its first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            return [
                f"{section}.{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
                for e in errors()
            ]
        except (TypeError, AttributeError):
            pass
    first = next((x for x in str(exc).splitlines() if x.strip()), type(exc).__name__)
    return [f"{section}: {first}"]


if __name__ == "__main__":
    report_json_request(check)
