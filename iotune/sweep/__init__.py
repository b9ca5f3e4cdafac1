"""`iotune sweep-aio`, `iotune sweep-threads` and `iotune sweep-checkpoint`: DeepSpeed's async
I/O, CPU Adam and the checkpoint writer tuned against their ceilings, each point a record.

May import: iotune.workers (by name, as processes), iotune.model (a run's swap pattern),
iotune.trace, iotune.checks, iotune.render, iotune.records, iotune.probes, iotune.proc,
iotune.units, iotune.errors. Not the plan, the run or the command line."""
