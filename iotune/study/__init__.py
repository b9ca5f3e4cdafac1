"""The study: a grid of training presets run one after another (`iotune study`), each
summarised in one record, from which `iotune report` builds the tables and figures.

Study directory:
    study.json      what was asked: the presets, steps, paths, sweeps, backend, host
    runs.jsonl      one summary record per finished run (ok, failed or skipped), appended
    runs/NAME/      each run's own directory, as `iotune trace --run` writes it
"""
