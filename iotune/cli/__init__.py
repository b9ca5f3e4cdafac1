"""The `iotune` command line: a thin package, one module per command family.

Each command parses its options, calls the library function that owns the rule, and renders
the result. :mod:`iotune.cli.app` holds the group, the global options and the mapping from
errors to exit codes.

May import: every room below it (docs/design.md, "Rooms"); nothing imports it but
iotune/__main__.py.
"""

from iotune.cli.app import cli, main

__all__ = ["cli", "main"]
