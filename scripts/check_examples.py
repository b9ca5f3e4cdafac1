#!/usr/bin/env python3
"""Check that the printed examples of the documentation still match what iotune prints, and
that the figures its prose and tables quote are those of the recording they come from.

    scripts/check_examples.py [FILE.md ...]      (default: README.md and docs/**/*.md)

An example is a fenced block whose lines start with ``$ iotune ...`` (a command, continued
over lines ending in a backslash), each followed by the output it printed. A line ``...``
stands for lines left out. The examples that need nothing but this checkout (``estimate``
and ``presets`` of presets, recorded sweeps and the example models, with no run of one's own
named) are run here and their printed lines must appear, in order, in what the command
prints now; the rest (a GPU machine's, a QEMU guest's, a run's) are listed as recorded
elsewhere.

A quoted figure is declared by an HTML comment on the line before the paragraph, list or
table that quotes it, naming the figures and where they were recorded:

    <!-- figures 7 16 32 89 from above -->
    <!-- figures 30.3 12.4 from $ iotune estimate opt_nvme_1b -->
    <!-- figures in columns Step s from benchmarks/RESULTS.md#the-drives-planner-... -->

``figures A B ...`` lists figures that the block below must show as written; ``figures in
columns NAME; NAME`` takes every number in those columns of the table below. The source is
``above`` (the printed lines of the nearest example before it in the same file), a command
``$ iotune ...`` that needs nothing but this checkout (run here), or a file of this
repository, optionally one section of it (``#`` and the heading's anchor as GitHub makes
it). Each figure must be a number of the source as it would be rounded to the figure's
decimals (26.2 quotes 26.17; 34 quotes 33.93); one written without a sign may quote a
negative one (within 6% quotes -5.5%).

Exit 1 when an example no longer matches or a quoted figure is not its recording's.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
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


@cache
def printed_by(command: tuple[str, ...]) -> tuple[str, ...]:
    """What ``iotune COMMAND`` prints here (stdout and stderr), once per command."""
    p = subprocess.run(
        [str(IOTUNE), *command],
        cwd=TOP,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        # as an AVX2 host prints them, on any host: the CPU presets' dtype (and so their host
        # RAM) follows the CPU's bf16 (iotune.probes.cpu); the docs show float32's
        env={"COLUMNS": "400", "PATH": "/usr/bin:/bin", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    )
    return tuple(x.rstrip() for x in (p.stdout + p.stderr).splitlines())


def check(ex: Example) -> str | None:
    missing = matches(ex.expected, list(printed_by(tuple(ex.command))))
    if missing is not None:
        return f"{ex.where}: 'iotune {shlex.join(ex.command)}' no longer prints: {missing!r}"
    return None


# ----------------------------------------------------------------------------- quoted figures

MARKER = re.compile(r"^<!--\s*figures\s+(?P<what>.*?)\s+from\s+(?P<source>.+?)\s*-->\s*$")
#: a number as text shows it: thousands separated by commas, decimals; a sign where no word,
#: digit or point comes before it (66-138 is two numbers, x4 and 2-core hold one each)
_DIGITS = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
NUMBER = re.compile(rf"(?<![\w.])[-+]?{_DIGITS}|(?<=[\w-]){_DIGITS}")


@dataclass
class Quote:
    """Figures a block of a document quotes, and the recording they come from."""

    file: Path
    line: int
    source: str
    figures: list[str]  # as written in the block
    block: list[str]  # the paragraph, list or table below the marker
    columns: list[str] | None = None  # figures in these columns of the table below
    above: Example | None = None  # the nearest example before the marker

    @property
    def where(self) -> str:
        name = self.file.relative_to(TOP) if self.file.is_relative_to(TOP) else self.file
        return f"{name}:{self.line}"


def numbers(text: str) -> list[str]:
    """Every number in *text*, as written (``-0.2``, ``1,200``, ``25.78``)."""
    return NUMBER.findall(text)


def value(figure: str) -> float:
    return float(figure.rstrip("%").replace(",", ""))


def quotes(figure: str, recorded: str) -> bool:
    """Whether *figure* (as a document writes it) is *recorded* rounded to its decimals; a
    figure without a sign may quote a negative one."""
    f = figure.rstrip("%")
    decimals = len(f.partition(".")[2])
    want, got = value(f), value(recorded)
    if not f.startswith(("-", "+")):
        want, got = abs(want), abs(got)
    return abs(want - got) <= 0.5 * 10.0**-decimals + 1e-9


def anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as
    hyphens (``.ci/run beside ...`` is ``cirun-beside-...``)."""
    text = heading.strip().lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def section(text: str, wanted: str) -> str | None:
    """The lines under the heading whose anchor is *wanted*, up to the next heading of its
    level or above; None where there is none."""
    lines = text.splitlines()
    fence = False
    for i, line in enumerate(lines):
        fence ^= bool(FENCE.match(line))
        m = re.match(r"^(#+)\s", line)
        if fence or not m or anchor(line) != wanted:
            continue
        level = len(m.group(1))
        out = [line]
        inner = False
        for rest in lines[i + 1 :]:
            inner ^= bool(FENCE.match(rest))
            h = re.match(r"^(#+)\s", rest)
            if not inner and h and len(h.group(1)) <= level:
                break
            out.append(rest)
        return "\n".join(out)
    return None


def block_after(lines: list[str], start: int) -> list[str]:
    """The paragraph, list or table that starts at *start* (0-based), up to a blank line;
    further markers before it (one per source) are passed over."""
    while start < len(lines) and MARKER.match(lines[start].strip()):
        start += 1
    out = []
    for line in lines[start:]:
        if not line.strip():
            break
        out.append(line)
    return out


def quotes_in(md: Path) -> list[Quote]:
    """Every figures marker of *md*, with the block it stands before."""
    lines = md.read_text().splitlines()
    exs = examples(md)
    out: list[Quote] = []
    inside = False
    for no, line in enumerate(lines, 1):
        if FENCE.match(line):
            inside = not inside
            continue
        m = MARKER.match(line.strip()) if not inside else None
        if not m:
            continue
        what = m.group("what").strip()
        before = [e for e in exs if e.line < no]
        columns = None
        if what.startswith("in column"):  # "in columns NAME; NAME"
            columns = [c.strip() for c in what.split(None, 2)[2].split(";") if c.strip()]
        out.append(
            Quote(
                file=md,
                line=no,
                source=m.group("source").strip(),
                figures=[] if columns is not None else what.split(),
                block=block_after(lines, no),
                columns=columns,
                above=before[-1] if before else None,
            )
        )
    return out


def table_cells(block: list[str], columns: list[str]) -> tuple[list[str], str | None]:
    """The cells of *columns* in the Markdown table *block*, or why there are none."""
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in block
        if line.lstrip().startswith("|")
    ]
    if len(rows) < 2:
        return [], "no table below it"
    head = rows[0]
    missing = [c for c in columns if c not in head]
    if missing:
        return [], f"the table below has no column {missing[0]!r} (it has {', '.join(head)})"
    idx = [head.index(c) for c in columns]
    body = [r for r in rows[1:] if not all(set(c) <= set("-: ") for c in r)]
    return [r[i] for r in body for i in idx if i < len(r)], None


def source_text(q: Quote) -> tuple[str | None, str]:
    """The recording *q* quotes, and its name; None with why where it cannot be read."""
    src = q.source
    if src == "above":
        if q.above is None:
            return None, "no example above it"
        return "\n".join(q.above.expected), f"the example at {q.above.where}"
    if src.startswith("$ iotune "):
        argv = shlex.split(src[2:])[1:]
        ex = Example(q.file, q.line, argv, [])
        why = runnable(ex)
        if why is not None:
            return None, f"'{src}' cannot be run here ({why})"
        return "\n".join(printed_by(tuple(argv))), f"'{src}'"
    path, _, wanted = src.partition("#")
    f = TOP / path
    if not f.is_file():
        return None, f"no file {path}"
    text = f.read_text()
    if wanted:
        part = section(text, wanted)
        if part is None:
            return None, f"{path} has no section #{wanted}"
        return part, f"{path}#{wanted}"
    return text, path


def check_quote(q: Quote) -> list[str]:
    """What is wrong with the figures *q* quotes: each must be in the block below the marker
    and be the recording's."""
    text, name = source_text(q)
    if text is None:
        return [f"{q.where}: figures from {q.source}: {name}"]
    bad = []
    if q.columns is not None:
        cells, why = table_cells(q.block, q.columns)
        if why is not None:
            return [f"{q.where}: {why}"]
        figs = [n for c in cells for n in numbers(c)]
    else:
        shown = "\n".join(q.block)
        figs = []
        for f in q.figures:
            if re.search(rf"(?<![\w.]){re.escape(f)}(?![\w%]|\.\d)", shown) is None:
                bad.append(f"{q.where}: figure {f} is listed but not in the text below it")
            else:
                figs.append(f)
    if not figs and not bad:
        return [f"{q.where}: no figure to check"]
    recorded = numbers(text)
    for f in figs:
        if not any(quotes(f, r) for r in recorded):
            bad.append(f"{q.where}: {f} is not a figure of {name}")
    return bad


def main(argv: list[str]) -> int:
    files = [Path(a).resolve() for a in argv] or [
        TOP / "README.md",
        *sorted((TOP / "docs").rglob("*.md")),
    ]
    failed: list[str] = []
    checked = skipped = figures = 0
    for md in files:
        for q in quotes_in(md):
            figures += 1
            for wrong in check_quote(q):
                failed.append(wrong)
                print(f"DIFFERS {wrong}")
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
    print(
        f"{checked} example(s) and {figures} block(s) of quoted figures checked, "
        f"{len(failed)} differ; {skipped} example(s) recorded elsewhere"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
