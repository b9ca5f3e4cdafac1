"""The model: what a run needs and what it moves, before anything runs. Training presets
(configs/presets.toml), the DeepSpeed config each one runs with, a user's own model and
config (a Hugging Face model, a DeepSpeed JSON or accelerate's YAML), and the estimate of
GPU memory, host RAM, NVMe space and the bytes DeepSpeed reads and writes per step; the
seed study's published figures beside them. Pure: no torch, no DeepSpeed, no device.

May import: iotune.probes (the CPU's dtype support), iotune.units, iotune.paths,
iotune.errors. Nothing above it: not the plan, the run, the sweeps or the command line."""
