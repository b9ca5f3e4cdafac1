"""iotune: measure and tune NVMe offload for DeepSpeed training."""

__version__ = "0.1.0"
