"""`iotune raid`: plan-then-apply mdadm volumes, safe by construction.

May import: iotune.render, iotune.probes, iotune.proc, iotune.units, iotune.errors."""
