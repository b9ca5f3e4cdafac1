"""`iotune trace`: exact per-request size accounting per drive, with eBPF, checked against
the kernel's own counters.

May import: iotune.checks, iotune.render, iotune.records, iotune.probes, iotune.proc,
iotune.paths, iotune.units, iotune.errors. Not the model, the run or the command line."""
