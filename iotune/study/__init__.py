"""The study: a grid of training presets run one after another (`iotune study`), each
summarised in one record, from which `iotune report` builds the tables and figures.

Study directory:
    study.json      what was asked: the presets, steps, paths, sweeps, backend, host
    runs.jsonl      one summary record per finished run (ok, failed or skipped), appended
    runs/NAME/      each run's own directory, as `iotune trace --run` writes it

May import: iotune.train (a run), iotune.plan, iotune.model, iotune.trace, iotune.checks,
iotune.probes, iotune.proc, iotune.records, iotune.units, iotune.errors. Not the report or the
command line.
"""
