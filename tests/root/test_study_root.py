"""`iotune study` over the tiny CPU presets on a real ext4 loop device, killed with SIGKILL
mid-grid and resumed; `iotune report` on it, and its HTML opened in headless chromium."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.root.conftest import IOTUNE, PLAIN, iotune, iotune_json

#: each step of a traced run waits at its event until the tracer has sampled it
pytestmark = pytest.mark.beside_study

ARTIFACTS = Path(os.environ.get("IOTUNE_ARTIFACTS", "test-artifacts")).resolve()
#: two runs: one finished before the kill, one killed in flight (the grid's accumulation
#: axis is the plan's, tests/unit/test_study_report.py; accumulation's I/O, test_train_root)
GRID = ["--presets", "tiny_opt_ram,tiny_opt_nvme", "--steps", "2"]
ORDER = ["tiny_opt_ram", "tiny_opt_nvme"]


def _records(study: Path) -> list[dict[str, Any]]:
    f = study / "runs.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def _pids_with(needle: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if needle.encode() in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                continue
    return out


def test_study_killed_mid_grid_resumes_without_redoing_or_losing_a_run(
    loop_device: Callable[..., str], tmp_path: Path
) -> None:
    """The killed study's workers start plainly: a zygote's worker has the server's command
    line, where the check below looks for the run's spec (the zygote's own kill -9 case:
    tests/unit/test_zygote.py). The resumed study's fork from the tier's zygote."""
    dev = loop_device(size_mib=2048, fs="ext4", mount=True)
    (mnt,) = tmp_path.glob("mnt*")
    # an NVMe drive's request limit: the loop device's 1280 KiB would merge two 512 KiB
    # AIO requests now and then, and the 512 KiB share would depend on timing
    Path(f"/sys/block/{Path(dev).name}/queue/max_sectors_kb").write_text("512")
    study = tmp_path / "study"
    log = tmp_path / "study.log"  # a file, not a pipe: a first op build prints a lot
    with log.open("w") as fh:
        child = subprocess.Popen(
            [IOTUNE, "study", *GRID, "--nvme-path", str(mnt), "--out", str(study)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, **PLAIN},
        )
    # kill -9 while the second run (tiny_opt_nvme) is in flight: it has started training
    in_flight = study / "runs" / "tiny_opt_nvme" / "steps.jsonl"
    deadline = time.monotonic() + 1200  # a guard against a hang, not a wait for a result
    try:
        while not (in_flight.exists() and '"event": "init"' in in_flight.read_text()):
            assert child.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the second run never started"
            time.sleep(0.2)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    before = _records(study)
    assert [r["preset"] for r in before] == ORDER[:1]
    assert all(r["status"] == "ok" for r in before)
    # the orphaned training worker dies with its parent (no swap files written afterwards)
    deadline = time.monotonic() + 60
    while _pids_with(str(study / "runs" / "tiny_opt_nvme" / "spec.json")):
        assert time.monotonic() < deadline, "the training worker outlived the study"
        time.sleep(0.5)
    assert any(p.name.startswith("iotune-swap-tiny_opt_nvme-") for p in mnt.iterdir())

    done = iotune_json("study", "--resume", str(study))
    after = _records(study)
    assert [r["preset"] for r in after] == ORDER
    assert after[:1] == before  # the finished run kept as it was, not redone
    assert [r["preset"] for r in done["runs"]] == ORDER
    assert all(r["status"] == "ok" for r in after), after
    assert (study / "runs" / ".partial").is_dir()  # the killed run's records kept aside
    assert [p.name for p in mnt.iterdir()] == ["lost+found"]  # its swap files removed
    nvme = [r for r in after if r["strategy"] == "opt_nvme"]
    for r in nvme:
        m, e = r["measured"], r["estimate"]
        # the I/O model's bytes; the ext4 journal adds a few KiB to a step's writes
        assert abs(m["read_gib"] - e["read_gib"]) <= 0.01 * e["read_gib"], r
        assert abs(m["write_gib"] - e["write_gib"]) <= 0.01 * e["write_gib"], r
        for op in ("read", "write"):
            focus, other = m[f"{op}_focus"], m[f"{op}_other"]
            assert focus and focus >= 0.95 * (focus + other), (r["preset"], op, focus, other)
    ram = [r for r in after if r["strategy"] == "opt_ram"]
    assert all(r["measured"]["read_gib"] is None for r in ram)

    # a refused run is recorded as skipped with the numbers, and the grid goes on
    loop_device(size_mib=64, fs="ext4", mount=True)
    small = sorted(tmp_path.glob("mnt*"))[-1]
    sh_out = iotune(
        "--json",
        "study",
        "--presets",
        "tiny_opt_nvme,tiny_opt_ram",
        "--steps",
        "1",
        "--nvme-path",
        str(small),
        "--out",
        str(tmp_path / "study2"),
        check=False,
    )
    assert sh_out.returncode == 0, sh_out.stderr
    doc = json.loads(sh_out.stdout)
    assert not doc["plan"][0]["fits"] and "free" in doc["plan"][0]["reason"]
    skipped, ran = doc["runs"]
    assert skipped["status"] == "skipped" and "GiB free" in skipped["error"]
    assert skipped["estimate"]["nvme_gib"] > 0.4
    assert ran["status"] == "ok"

    _report_opens_in_chromium(study, tmp_path / "report")


def _report_opens_in_chromium(study: Path, out: Path) -> None:
    written = iotune_json("report", str(study), "--out", str(out))
    figs = written["figures"]
    assert {"step_time.png", "optimizer_share.png", "nvme_bytes.png", "request_sizes.png"} <= set(
        figs
    )
    md = (out / "report.md").read_text()
    assert "## Model size tiny" in md and "| opt_nvme | 1 | ok |" in md
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is not installed: scripts/setup.sh test installs it"
    page = f"file://{out / 'report.html'}"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [chromium, *flags, "--virtual-time-budget=5000", "--dump-dom", page],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    # the page's own check: every figure decoded and laid out by the browser
    assert f'data-figures-rendered="{len(figs)}/{len(figs)}"' in dom, dom[:400]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "study-report.png"
    subprocess.run(
        [chromium, *flags, "--window-size=1400,4200", f"--screenshot={shot}", page],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
