#!/usr/bin/env python3
"""Mutation testing of iotune's pure model code with mutmut: every mutant of the modules in
setup.cfg's [mutmut] only_mutate is run against the unit tests named there, and the score
(killed / all that ran) must reach --min (default 85%). Each survivor is listed with its
diff, and one that a test cannot kill is explained in scripts/mutation_survivors.txt; an
explained survivor counts as such, an unexplained one is printed for a reader.

The run happens in a scratch copy of the checkout holding only the package, its data and the
tests it needs: mutmut copies the tests folder whole, and tests/data holds recorded sysfs
trees whose symlinks loop.

    scripts/mutation.py                 # the whole set
    scripts/mutation.py --half          # every other mutant of each function, as CI runs it
    scripts/mutation.py --min 0 --keep  # see the score, keep the scratch copy
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
#: the recorded data the selected tests read
DATA = ("study-h100", "run-tiny-opt-nvme", "custom")
EXPLAINED = TOP / "scripts" / "mutation_survivors.txt"
#: --half: mutmut numbers each function's mutants from 1; the odd ones are every other
#: mutant of every function, the first among them (a function of one mutant is not left out)
HALF = ["*__mutmut_*[13579]"]


def _config() -> tuple[list[str], list[str]]:
    cp = configparser.ConfigParser()
    cp.read(TOP / "setup.cfg")
    mods = [x for x in cp.get("mutmut", "only_mutate").split("\n") if x.strip()]
    tests = [
        x for x in cp.get("mutmut", "pytest_add_cli_args_test_selection").split("\n") if x.strip()
    ]
    return mods, tests


def stage(where: Path, tests: list[str]) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in ("iotune", "configs", "bpf", "raid", "benchmarks/results"):
        shutil.copytree(TOP / d, where / d, ignore=ignore)
    for f in ("setup.cfg", "pyproject.toml"):
        shutil.copy2(TOP / f, where / f)
    (where / "tests" / "unit").mkdir(parents=True)
    (where / "tests" / "vm").mkdir()
    for f in (
        "tests/__init__.py",
        "tests/conftest.py",
        "tests/background.py",
        "tests/io_rules.py",
        "tests/progress.py",  # the zygote fixture's wait (tests/conftest.py)
        "tests/striping.py",  # the stripe's share counted chunk by chunk
        "tests/unit/__init__.py",
        # a unit test checks what the vm tier refuses (tests/vm/guest.py): pure logic
        "tests/vm/__init__.py",
        "tests/vm/guest.py",
        # the vm study's model (its --set overrides), which a unit test plans
        "tests/vm/guest_ops.py",
        "tests/vm/study_lab.py",
    ):
        shutil.copy2(TOP / f, where / f)
    for t in tests:  # the test files; not the options among them (--deselect and its node)
        if not t.startswith("-") and "::" not in t:
            shutil.copy2(TOP / t, where / t)
    for d in DATA:
        shutil.copytree(TOP / "tests" / "data" / d, where / "tests" / "data" / d, symlinks=True)


def explained() -> dict[str, str]:
    """mutant name -> why no test kills it (the file: NAME: reason, one a line)."""
    out = {}
    if EXPLAINED.exists():
        for line in EXPLAINED.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                name, _, why = line.partition(": ")
                out[name.strip()] = why.strip()
    return out


#: a string literal in a line of Python (no escaped quotes in the model code's labels)
_LITERAL = re.compile(r"""(?:[rfbuRFBU]{1,2})?("[^"]*"|'[^']*')""")


def text_only(diff: str) -> str | None:
    """The original literal when a mutant's diff changes nothing but the text inside one
    string literal of one line (mutmut's "XX...XX" and case mutants of a label)."""
    minus = [x[1:] for x in diff.splitlines() if x.startswith("-") and not x.startswith("---")]
    plus = [x[1:] for x in diff.splitlines() if x.startswith("+") and not x.startswith("+++")]
    if len(minus) != 1 or len(plus) != 1:
        return None
    a, b = _LITERAL.findall(minus[0]), _LITERAL.findall(plus[0])
    if len(a) != len(b) or _LITERAL.sub("S", minus[0]) != _LITERAL.sub("S", plus[0]):
        return None
    changed = [x for x, y in zip(a, b, strict=True) if x != y]
    return changed[0][1:-1] if len(changed) == 1 else None


def docs_printed() -> list[str]:
    """Every line the documentation's examples that run here print (scripts/check_examples.py
    runs each and requires these lines, in order, in the command's output: a test outside
    mutmut's reach, since it runs the installed command in a process of its own)."""
    sys.path.insert(0, str(TOP / "scripts"))
    import check_examples as ce

    mds = [TOP / "README.md", *sorted((TOP / "docs").rglob("*.md"))]
    return [
        line
        for md in mds
        for ex in ce.examples(md)
        if ce.runnable(ex) is None
        for line in ex.expected
    ]


def checked_by_docs(literal: str, printed: list[str]) -> bool:
    """True where every fixed part of *literal* (the text between an f-string's fields, the
    longest at least 12 characters) is in a line the docs' runnable examples print."""
    parts = [p for p in re.split(r"\{[^}]*\}", literal) if p.strip()]
    if not parts or max(len(p) for p in parts) < 12:
        return False
    return all(any(p in line for line in printed) for p in parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min", type=float, default=85.0, help="the lowest score that passes, %%")
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy")
    ap.add_argument("--json", type=Path, help="write the counts and survivors here")
    ap.add_argument("--only", action="append", help="mutate only this module (repeatable)")
    ap.add_argument("--show", type=int, default=20, help="print at most this many survivors")
    ap.add_argument(
        "--half",
        action="store_true",
        help="run the odd-numbered mutants of each function only (its first among them)",
    )
    args = ap.parse_args()
    mods, tests = _config()
    if args.only:
        mods = args.only
    scratch = Path(tempfile.mkdtemp(prefix="iotune-mutation-"))
    t0 = time.monotonic()
    try:
        stage(scratch, tests)
        if args.only:  # the scratch copy's own config names the modules asked for
            cfg = (scratch / "setup.cfg").read_text()
            head, _, rest = cfg.partition("only_mutate =\n")
            # the modules' list ends at the first line that is not one of its items: the
            # other keys' lists (the tests, the arguments) stay as they are
            lines = rest.split("\n")
            n = next(i for i, line in enumerate(lines) if not line.startswith("    "))
            (scratch / "setup.cfg").write_text(
                head
                + "only_mutate =\n"
                + "".join(f"    {m}\n" for m in mods)
                + "\n".join(lines[n:])
            )
        env = {
            **os.environ,
            "CI": "",
            "PYTHONDONTWRITEBYTECODE": "1",
            "IOTUNE_HYPOTHESIS": "mutation",
        }
        mutmut = Path(sys.executable).with_name("mutmut")
        run = subprocess.run(
            [
                str(mutmut),
                "run",
                "--max-children",
                str(os.cpu_count() or 2),
                *(HALF if args.half else []),
            ],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            check=False,  # no clock: mutmut stops a mutant that hangs, CI a run that does
        )
        if run.returncode != 0:
            tail = "\n".join((run.stdout + run.stderr).replace("\r", "\n").splitlines()[-30:])
            print(f"mutation: mutmut run exited {run.returncode}:\n{tail}", file=sys.stderr)
            return 2
        subprocess.run(
            [str(mutmut), "export-cicd-stats"],
            cwd=scratch,
            env=env,
            check=True,
            capture_output=True,
        )
        stats = json.loads((scratch / "mutants" / "mutmut-cicd-stats.json").read_text())
        res = subprocess.run(
            [str(mutmut), "results", "--all", "true"],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        survivors = []
        for line in res.stdout.splitlines():
            m = re.match(r"\s*(\S+): survived", line)
            if m:
                survivors.append(m.group(1))
        why = explained()
        printed = docs_printed()
        # each diff read once: to tell a label's text from a change of behaviour, and to print
        diffs = {
            name: subprocess.run(
                [str(mutmut), "show", name],
                cwd=scratch,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            for name in survivors
            if name not in why
        }
        for name, diff in diffs.items():
            literal = text_only(diff)
            if literal is not None and checked_by_docs(literal, printed):
                why[name] = f"the text {literal!r} is printed by a docs example checked in CI"
        killed = int(stats["killed"])
        # mutants no test reaches, or that time out, count against the score as survivors do
        counted = killed + int(stats["survived"]) + int(stats.get("no_tests", 0))
        counted += int(stats.get("timeout", 0)) + int(stats.get("suspicious", 0))
        killed += int(stats.get("timeout", 0))  # an endless loop is a mutant the tests caught
        score = 100.0 * killed / counted if counted else 0.0
        unexplained = [s for s in survivors if s not in why]
        print(
            f"mutation: {killed} of {counted} mutants killed ({score:.1f}%) over "
            f"{', '.join(mods)}; {len(survivors)} survived ({len(survivors) - len(unexplained)} "
            f"explained in {EXPLAINED.relative_to(TOP)} or by a docs example); "
            f"{stats.get('no_tests', 0)} reached by no "
            f"test; {time.monotonic() - t0:.0f} s"
        )
        for s in unexplained[: args.show]:
            print(f"--- survived: {s}\n{diffs[s].strip()}")
        if args.json:
            args.json.write_text(
                json.dumps(
                    {"stats": stats, "score": score, "survivors": survivors, "modules": mods},
                    indent=2,
                )
            )
        if score < args.min:
            print(f"mutation: the score {score:.1f}% is below {args.min:g}%", file=sys.stderr)
            return 1
        return 0
    finally:
        if args.keep:
            print(f"mutation: the scratch copy is {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
