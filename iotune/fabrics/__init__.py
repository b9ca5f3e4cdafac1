"""NVMe over Fabrics: where a target is, and connecting its namespaces."""
