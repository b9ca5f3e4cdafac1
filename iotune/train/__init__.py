"""The run: one offloaded training run or a user's own script, traced. Preflight, the run
directory, the command line of DeepSpeed's launcher for several ranks or nodes, the workers'
requests, checkpoints and resumes, the swap folder's watch that finds a script's steps, what
a traced script really ran with, and the run's records (run.json, the seed study's table
with the prediction beside each step).

May import: iotune.plan (the prediction beside the measurement), iotune.model, iotune.sweep,
iotune.workers (by name, as processes), iotune.trace, iotune.probes, iotune.checks,
iotune.records, iotune.proc, iotune.units, iotune.errors. Not the study or the command line."""
