"""NVMe over Fabrics: where a target is, and connecting its namespaces.

May import: iotune.probes, iotune.proc, iotune.errors."""
