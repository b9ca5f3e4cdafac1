"""The numeric DeepSpeed config keys a --set ds.KEY is checked against, and the values each
takes: DeepSpeed's own bounds, raised where DeepSpeed takes a value and then fails on it
(iotune.model.presets.check_ds_value refuses the rest in one line). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DsBound:
    """The values a numeric DeepSpeed key takes."""

    least: float
    most: float | None = None
    integer: bool = True
    above: bool = False  # least itself is refused (pydantic's gt=)
    below: bool = False  # most itself is refused (pydantic's lt=)
    auto: bool = False  # "auto" is taken too
    example: str = "1"

    def says(self) -> str:
        """What the key must be, e.g. 'a positive integer', 'a number from 0 to 1'."""
        if self.integer:
            text = (
                "a positive integer"
                if self.least == 1 or (self.least == 0 and self.above)
                else f"an integer of {self.least:g} or more"
            )
        elif self.most is None:
            text = f"a number {'above' if self.above else 'of'} {self.least:g}" + (
                "" if self.above else " or more"
            )
        elif self.above or self.below:
            text = (
                f"a number {'above' if self.above else 'from'} {self.least:g} and "
                f"{'below' if self.below else 'up to'} {self.most:g}"
            )
        else:
            text = f"a number from {self.least:g} to {self.most:g}"
        return text + (' or "auto"' if self.auto else "")

    def takes(self, value: Any) -> Any:
        """*value* as the key takes it (an integral float as an int), or None: refused."""
        if self.auto and value == "auto":
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if self.integer and isinstance(value, float):
            if not value.is_integer():
                return None
            value = int(value)
        if value < self.least or (self.above and value == self.least):
            return None
        if self.most is not None and (value > self.most or (self.below and value == self.most)):
            return None
        return value


_POS = DsBound(1)
_NONNEG = DsBound(0)

#: the numeric DeepSpeed keys a --set is checked against (dotted under the config's top).
#: DeepSpeed's pydantic bounds (runtime/zero/config.py, offload_config.py,
#: zenflow/zenflow_config.py) are the floor; some are raised where DeepSpeed takes a value
#: and then fails on it: no swap buffer (buffer_count 0: range() with step 0 in
#: optimizer_utils.py), steps_per_print 0 (a modulo in engine.py). The aio section is a
#: plain dict to DeepSpeed (swap_tensor/aio_config.py checks nothing): its sizes and counts
#: must be positive for the aio handle.
DS_BOUNDS: dict[str, DsBound] = {
    "aio.block_size": DsBound(1, example="1048576"),
    "aio.queue_depth": DsBound(1, example="8"),
    "aio.intra_op_parallelism": _POS,
    "steps_per_print": DsBound(1, example="100"),
    "gradient_clipping": DsBound(0, integer=False, example="1.0"),
    "zero_optimization.sub_group_size": DsBound(0, example="100000000"),  # 0: one tensor each
    "zero_optimization.reduce_bucket_size": DsBound(1, example="500000000"),
    "zero_optimization.allgather_bucket_size": DsBound(0, example="500000000"),
    "zero_optimization.stage3_prefetch_bucket_size": DsBound(0, example="50000000"),
    "zero_optimization.stage3_param_persistence_threshold": DsBound(0, example="100000"),
    "zero_optimization.stage3_model_persistence_threshold": _NONNEG,
    "zero_optimization.stage3_max_live_parameters": DsBound(0, example="1000000000"),
    "zero_optimization.stage3_max_reuse_distance": DsBound(0, example="1000000000"),
    "zero_optimization.offload_optimizer.buffer_count": DsBound(1, example="4"),
    "zero_optimization.offload_optimizer.ratio": DsBound(0, 1, integer=False, example="1.0"),
    "zero_optimization.offload_param.buffer_count": DsBound(1, example="5"),
    "zero_optimization.offload_param.buffer_size": DsBound(1, example="100000000"),
    "zero_optimization.offload_param.max_in_cpu": DsBound(0, example="1000000000"),
    "zero_optimization.zenflow.topk_ratio": DsBound(
        0, 1, integer=False, above=True, below=True, example="0.1"
    ),
    "zero_optimization.zenflow.update_interval": DsBound(1, auto=True, example="4"),
    "zero_optimization.zenflow.select_interval": DsBound(0, auto=True, example="1"),
    "zero_optimization.zenflow.full_warm_up_rounds": DsBound(0, example="0"),
}
#: the same keys by their pydantic field names, which DeepSpeed takes too (populate_by_name)
for _alias in ("prefetch_bucket_size", "param_persistence_threshold", "max_live_parameters"):
    DS_BOUNDS[f"zero_optimization.{_alias}"] = DS_BOUNDS[f"zero_optimization.stage3_{_alias}"]
DS_BOUNDS["zero_optimization.model_persistence_threshold"] = _NONNEG
DS_BOUNDS["zero_optimization.max_reuse_distance"] = DS_BOUNDS[
    "zero_optimization.stage3_max_reuse_distance"
]
