"""Read-only probes of the host: sysfs/procfs/udev readers that return frozen records.

Every reader takes a :class:`~iotune.probes.sysfs.SysTree`, so tests point it at a tree
recorded from a real host under ``tests/data/<machine>/``.

May import: iotune.proc, iotune.errors. Nothing above it.
"""
