"""`iotune report`: the study's tables and figures from study, run and sweep directories.

:mod:`load` finds what each directory holds; :mod:`tables` turns records into rows;
:mod:`figures` draws them with matplotlib; :mod:`document` writes report.md and a
self-contained report.html.

May import: iotune.study, iotune.model, iotune.sweep (their records), iotune.records, iotune.units,
iotune.errors. Not the run or the command line.
"""
