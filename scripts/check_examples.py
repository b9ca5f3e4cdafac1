#!/usr/bin/env python3
"""Check that the printed examples of the documentation still match what iotune prints.

    scripts/check_examples.py [FILE.md ...]      (default: README.md and docs/**/*.md)

An example is a fenced block whose lines start with ``$ iotune ...`` (a command, continued
over lines ending in a backslash), each followed by the output it printed. A line ``...``
stands for lines left out. The examples that need nothing but this checkout (``estimate``
and ``presets`` of presets, recorded sweeps and the example models, with no run of one's own
named) are run here and their printed lines must appear, in order, in what the command
prints now; the rest (a GPU machine's, a QEMU guest's, a run's) are listed as recorded
elsewhere. Exit 1 when an example no longer matches.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
IOTUNE = Path(sys.executable).parent / "iotune"
#: commands whose output depends on nothing but the checkout
CHECKED = ("estimate", "presets")
FENCE = re.compile(r"^```")


@dataclass
class Example:
    file: Path
    line: int
    command: list[str]
    expected: list[str]

    @property
    def where(self) -> str:
        name = self.file.relative_to(TOP) if self.file.is_relative_to(TOP) else self.file
        return f"{name}:{self.line}"


def examples(md: Path) -> list[Example]:
    """Every ``$ iotune`` command in a fenced block of *md*, with the lines printed after it."""
    out: list[Example] = []
    lines = md.read_text().splitlines()
    inside = False
    cur: Example | None = None
    pending = ""
    for no, line in enumerate(lines, 1):
        if FENCE.match(line):
            inside = not inside
            cur = None
            continue
        if not inside:
            continue
        if pending or line.startswith("$ iotune "):
            text = pending + line.strip()
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            pending = ""
            try:
                argv = shlex.split(text[2:])
            except ValueError:
                continue
            cur = Example(md, no, argv[1:], [])
            out.append(cur)
        elif line.startswith("$ "):
            cur = None
        elif cur is not None:
            cur.expected.append(line.rstrip())
    return out


def runnable(ex: Example) -> str | None:
    """Why an example cannot be run here (None: it can)."""
    if not ex.command or ex.command[0] not in CHECKED:
        return f"'iotune {ex.command[0] if ex.command else ''}' needs a host of its own"
    for a in ex.command:
        if "$" in a:
            return "it names a shell variable"
    for flag in ("--baseline", "--aio-config", "--threads-config", "--model", "--ds-config"):
        if flag in ex.command:
            value = ex.command[ex.command.index(flag) + 1]
            if value != "study" and not (TOP / value).exists():
                return f"{flag} {value} is a record of another host"
    return None


def matches(expected: list[str], printed: list[str]) -> str | None:
    """The first expected line not found, in order ('...' skips any lines), or None."""
    at = 0
    for want in expected:
        if want.strip() in ("", "..."):
            continue
        while at < len(printed) and printed[at].rstrip() != want:
            at += 1
        if at == len(printed):
            return want
        at += 1
    return None


def check(ex: Example) -> str | None:
    p = subprocess.run(
        [str(IOTUNE), *ex.command],
        cwd=TOP,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"},
    )
    printed = [x.rstrip() for x in (p.stdout + p.stderr).splitlines()]
    missing = matches(ex.expected, printed)
    if missing is not None:
        return f"{ex.where}: 'iotune {shlex.join(ex.command)}' no longer prints: {missing!r}"
    return None


def main(argv: list[str]) -> int:
    files = [Path(a).resolve() for a in argv] or [
        TOP / "README.md",
        *sorted((TOP / "docs").rglob("*.md")),
    ]
    failed: list[str] = []
    checked = skipped = 0
    for md in files:
        for ex in examples(md):
            why = runnable(ex)
            if why is not None:
                skipped += 1
                print(f"recorded elsewhere: {ex.where}: {why}")
                continue
            checked += 1
            bad = check(ex)
            if bad:
                failed.append(bad)
                print(f"DIFFERS {bad}")
            else:
                print(f"ok {ex.where}: iotune {shlex.join(ex.command)}")
    print(f"{checked} example(s) checked, {len(failed)} differ; {skipped} recorded elsewhere")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
