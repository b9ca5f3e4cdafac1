"""`iotune trace`: exact per-request size accounting per drive, with eBPF, checked against
the kernel's own counters."""
