"""The plan made before purchase: how many drives, of which kind, a run needs. A drive's
datasheet, the step predicted on a RAID0 of K drives (from a sweep, a run's swaps or a
datasheet), endurance, the checkpoint volume (RAID5/6, how often to save), advice on a
config, and what `iotune presets` and `iotune estimate` print. Its measured inputs are the
records of sweeps and runs (a run's document read back: rundoc).

May import: iotune.model, iotune.sweep (sweeps' records and the checkpoint ceiling),
iotune.trace (a path's drives), iotune.probes, iotune.records, iotune.units, iotune.errors.
Not the run (iotune.train), the study or the command line."""
