"""Code that imports torch or DeepSpeed runs here, each in its own process, so a crash, a hang
or CUDA state costs one record, not the caller."""
