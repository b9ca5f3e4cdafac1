"""Step time predicted from measurements: the I/O model's bytes per step over the bandwidth
a sweep (or a run, or a datasheet) gives the target, plus CPU Adam, plus forward and
backward from a baseline. Pure: the inputs are read by :mod:`iotune.plan.measured`.

DeepSpeed's ZeRO-3 optimizer step with the optimizer state on NVMe (runtime/zero/stage3.py,
``_optimizer_step`` per sub-group, runtime/swap_tensor/partitioned_optimizer_swapper.py):
for each sub-group it swaps in the fp32 master, both Adam moments and the fp32 gradients
(12 bytes per parameter plus 4 per gradient element), runs CPU Adam on it, and swaps the
master and moments out (12 bytes); without ``pipeline_read``/``pipeline_write`` (iotune's
presets, DeepSpeed's default) these three phases do not overlap. The gradients were written
during backward (4 bytes per swapped gradient element), a reduce bucket at a time, so what
of that write outlasts backward (:func:`gradient_tail`) belongs to the step but not to the
optimizer's time. Hence::

    optimizer = read(12 n_s + 4 n_g) / R + Adam(N) + write(12 n_s) / W
    step      = forward + backward (baseline) + tail(write(4 n_g) / W) + optimizer

R and W are the bandwidths at the run's aio block (a sweep's median at that configuration,
or what the planner makes of a run's swaps or a datasheet). Adam(N) is the thread sweep's
median step time scaled to N parameters (CPU Adam is memory-bandwidth bound: time grows with
N) at the run's thread count, or a baseline's optimizer step without its swaps.

Each term carries its kind: the drives' ("read", "write", "gradients", "parameters"), CPU
Adam's ("adam") and the accelerator's ("compute"), so that what waits on the drives is
told from the rest without reading labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from iotune.model.estimate import Estimate
from iotune.model.presets import Preset
from iotune.records import DRIVE_KINDS
from iotune.units import amount

if TYPE_CHECKING:
    from iotune.plan.measured import AdamRate, Bandwidth, Baseline


class Term(NamedTuple):
    label: str  # what the term is ("forward + backward"), the drives' with their rate
    seconds: float
    kind: str  # read, write, gradients, parameters (the drives), adam, compute
    source: str = ""  # where its figure comes from, where not said in the label

    @property
    def what(self) -> str:
        """The term as the prediction prints it: its label, then its source."""
        return f"{self.label} ({self.source})" if self.source else self.label


@dataclass(frozen=True)
class Prediction:
    optimizer_s: float | None
    step_s: float | None
    terms: list[Term] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def drive_s(self) -> float:
        """Seconds the step waits on its drives."""
        return sum(t.seconds for t in self.terms if t.kind in DRIVE_KINDS)

    @property
    def other_s(self) -> float:
        """Seconds of the step that no drive sets: CPU Adam, forward + backward."""
        return sum(t.seconds for t in self.terms if t.kind not in DRIVE_KINDS)

    def seconds(self, kind: str) -> float:
        return sum(t.seconds for t in self.terms if t.kind == kind)

    def to_json(self) -> dict[str, Any]:
        return {
            "optimizer_s": None if self.optimizer_s is None else round(self.optimizer_s, 3),
            "step_s": None if self.step_s is None else round(self.step_s, 3),
            "terms": [
                {"what": t.what, "seconds": round(t.seconds, 3), "kind": t.kind, "source": t.source}
                for t in self.terms
            ],
            "notes": list(self.notes),
        }


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 10**9 else f"{n / 1e6:.1f}M"


def predict(
    preset: Preset,
    est: Estimate,
    bw: Bandwidth | None,
    adam: AdamRate | None,
    base: Baseline | None = None,
) -> Prediction:
    """Optimizer and step time of one steady step (module docstring). Pure."""
    s = preset.strategy
    notes: list[str] = []
    if s.zenflow:
        return Prediction(
            None,
            None,
            notes=["ZenFlow overlaps the CPU update with the next steps' GPU work: not modelled"],
        )
    if s.optimizer == "gpu":
        return Prediction(None, None, notes=["no offload: nothing the drives or CPU Adam bound"])
    if s.params == "nvme" and s.optimizer != "nvme":
        return Prediction(
            None,
            None,
            notes=["parameters on NVMe with the optimizer state elsewhere: not modelled"],
        )
    sw = est.swapped
    # the node's ranks each swap their own partition (est.swapped is one rank's) through the
    # node's drives, and each steps its own share of the parameters on its own cores
    ranks = max(1, est.ranks)
    opt_read = (12 * sw.n_s + 4 * sw.n_g) * ranks  # the node's optimizer swaps of a step
    opt_write = 12 * sw.n_s * ranks
    grad_write = 4 * sw.n_g * ranks
    terms: list[Term] = []
    cpu = base is not None and base.optimizer_s is not None and s.optimizer == "nvme"
    if cpu and base and base.optimizer_s is not None:
        # the baseline's optimizer step without its swapping
        adam_s = base.optimizer_s
        adam_what = "optimizer step without swapping"
        adam_src = base.adam_source or base.source
    elif adam is not None:
        if adam.note:
            notes.append(adam.note)
        share = est.params // max(1, est.world)
        adam_s = adam.seconds_per_param * share
        if est.world > 1:
            side = (
                f"timed with {adam.ranks} ranks at once"
                if adam.ranks == ranks > 1
                else "the ranks side by side (a core per thread)"
            )
            adam_what = (
                f"CPU Adam, each of {est.world} ranks' {_count(share)} parameters at "
                f"{adam.threads} thread(s), {side}"
            )
        else:
            adam_what = f"CPU Adam, {_count(share)} parameters at {adam.threads} thread(s)"
        adam_src = adam.source_label or ""
    else:
        return Prediction(
            None,
            None,
            notes=["CPU Adam not measured: pass --threads-config (or --baseline)"],
        )
    how = ""
    if s.optimizer == "nvme":
        if bw is None:
            return Prediction(None, None, notes=["no AIO bandwidth: pass --aio-config SWEEP_RUN"])
        if bw.note:
            notes.append(bw.note)
        rd, wr = opt_read, opt_write
        how = f" ({bw.how})" if bw.how else ""
        terms.append(
            Term(f"read {amount(rd)} at {amount(bw.read, '/s')}{how}", rd / bw.read, "read")
        )
        terms.append(Term(adam_what, adam_s, "adam", adam_src))
        terms.append(
            Term(f"write {amount(wr)} at {amount(bw.write, '/s')}{how}", wr / bw.write, "write")
        )
        # parameters on NVMe too: the step writes the updated parameters back (the I/O
        # model's steady write beyond the optimizer state and the gradients)
        back = max(0, est.steady_step.write - wr - grad_write)
        if back:
            terms.append(
                Term(
                    f"write {amount(back)} of updated parameters at {amount(bw.write, '/s')}{how}",
                    back / bw.write,
                    "parameters",
                )
            )
    else:
        terms.append(Term(adam_what, adam_s, "adam", adam_src))
    optimizer = sum(t.seconds for t in terms)
    step = None
    if base is not None:
        step = base.forward_backward_s + optimizer
        terms.append(Term("forward + backward", base.forward_backward_s, "compute", base.source))
        # parameters on NVMe: forward, the recomputation and backward fetch them (the I/O
        # model's steady read beyond the optimizer's), each fetch waited for on a CPU run
        fetch = max(0, est.steady_step.read - opt_read)
        if s.optimizer == "nvme" and bw is not None and fetch:
            step += fetch / bw.read
            terms.append(
                Term(
                    f"read {amount(fetch)} of parameters in forward + backward at "
                    f"{amount(bw.read, '/s')}{how}",
                    fetch / bw.read,
                    "parameters",
                )
            )
        grads = grad_write if s.optimizer == "nvme" and bw is not None else 0
        if grads and bw:
            # DeepSpeed writes the gradients of each reduce bucket asynchronously as the last
            # micro-step's backward fills it, the last bucket's at backward's end: what of
            # the writing is left when backward ends lengthens the step
            backward = (base.backward_s or 0.0) / preset.ga
            write = grads / bw.write
            buckets, extra = gradient_tail(write, backward, est.params, est.reduce_bucket)
            step += extra
            terms.append(
                Term(
                    f"gradients written, {amount(grads)} in {write:.2f} s, "
                    + (
                        "one reduce bucket at backward's end"
                        if buckets == 1
                        else f"a reduce bucket at a time ({buckets})"
                    )
                    + f": {write - extra:.2f} s of it behind the {backward:.2f} s of backward",
                    extra,
                    "gradients",
                )
            )
    else:
        notes.append(
            "step time needs forward + backward: pass --baseline RUN (any run of this model and "
            "batch: an NVMe run, a RAM run, a GPU-only run)"
        )
    return Prediction(optimizer, step, terms, notes)


def gradient_tail(write_s: float, backward_s: float, params: int, bucket: int) -> tuple[int, float]:
    """(reduce buckets, seconds the gradients' writes run past the end of backward).

    ZeRO-3 reduces the gradients a bucket of *bucket* elements at a time and, at the
    accumulation boundary, writes each bucket's partition as soon as it is reduced
    (stage3.py ``partition_grads`` calls ``swap_out_gradients`` per bucket), one write after
    the other; the last bucket is only complete when backward ends. Backward is taken to
    produce the *params* gradients evenly over *backward_s*, so with a share ``b`` of them per
    bucket, bucket j is ready at ``min(1, j b) backward_s`` and takes its share of *write_s*.
    The writes end at the latest of each bucket's ready time plus the writing from it on (a
    queue served one after the other); that sum grows or falls evenly over the full buckets,
    so the latest is at the first, the last full one or the partial last one. One bucket (any
    model under DeepSpeed's default of 500M elements) writes everything after backward. Pure.
    """
    n = max(1, params)
    b = min(n, max(1, bucket))
    count = -(-n // b)
    share = b / n

    def end(j: int) -> float:  # bucket j's ready time plus the writing from it on
        return min(1.0, j * share) * backward_s + (1 - (j - 1) * share) * write_s

    tail = max(end(1), end(max(1, count - 1)), end(count)) - backward_s
    return count, max(0.0, tail)
