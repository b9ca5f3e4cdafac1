"""`iotune study --volume`: the grid's NVMe runs once per offload volume, each record saying
the drives behind its volume, on real ext4 loop devices; the report side by side; bad
volumes refused before anything runs."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.root.conftest import iotune, iotune_json

#: each step of a traced run waits at its event until the tracer has sampled it
pytestmark = pytest.mark.beside_study


def _volumes(loop_device: Callable[..., str], n: int) -> list[tuple[str, Path]]:
    out = []
    for _ in range(n):
        dev = loop_device(size_mib=1024, fs="ext4", mount=True)
        Path(f"/sys/block/{Path(dev).name}/queue/max_sectors_kb").write_text("512")
        out.append((Path(dev).name, loop_device.mounts[-1]))  # type: ignore[attr-defined]
    return out


def test_study_over_two_volumes_runs_each_nvme_run_on_each(
    loop_device: Callable[..., str], tmp_path: Path
) -> None:
    (da, ma), (db, mb) = _volumes(loop_device, 2)
    study = tmp_path / "study"
    # (a RAM run runs once whatever the volumes: the unit tier's expansion test)
    args = ["study", "--presets", "tiny_opt_nvme", "--steps", "2"]
    args += ["--volume", f"a={ma}", "--volume", f"b={mb}", "--out", str(study)]
    doc = iotune_json(*args)
    runs = doc["runs"]
    assert [r["run"] for r in runs] == ["tiny_opt_nvme@a", "tiny_opt_nvme@b"]
    assert all(r["status"] == "ok" for r in runs), [r.get("error") for r in runs]
    a, b = runs
    for r, dev, mnt in ((a, da, ma), (b, db, mb)):
        v = r["volume"]
        assert (v["path"], v["drives"], v["members"], v["level"]) == (str(mnt), [dev], 1, None)
        # the run's requests were counted on its own volume's drive, and only there
        assert [d["name"] for d in r["drives"]] == [dev]
        assert Path(r["run_dir"]).name == r["run"]
        # the same model on either volume: the estimate's bytes (writes: and ext4's journal)
        m, e = r["measured"], r["estimate"]
        assert m["read_gib"] == e["read_gib"]
        assert 0 <= m["write_gib"] - e["write_gib"] <= 0.0002
    spec = json.loads((study / "study.json").read_text())
    assert [v["name"] for v in spec["volumes"]] == ["a", "b"]
    # resume keeps every run, redoes none
    again = iotune_json("study", "--resume", str(study))
    assert again["runs"] == runs
    rep = iotune_json("report", str(study), "--out", str(tmp_path / "report"))
    md = (Path(rep["out"]) / "report.md").read_text()
    for label in ("opt_nvme on a (1 drive)", "opt_nvme on b (1 drive)", "request_sizes.png"):
        assert label in md, label


def test_bad_volumes_get_one_line_and_nothing_runs(
    loop_device: Callable[..., str], tmp_path: Path
) -> None:
    ((dev, mnt),) = _volumes(loop_device, 1)
    (mnt / "x").mkdir()
    (mnt / "y").mkdir()
    ro = loop_device(size_mib=64, fs="ext4")
    ro_mnt = tmp_path / "ro"
    ro_mnt.mkdir()
    subprocess.run(["mount", "-o", "ro", ro, str(ro_mnt)], check=True)
    loop_device.mounts.append(ro_mnt)  # type: ignore[attr-defined]
    root_dir = Path("/var/tmp/iotune-volume-test")
    root_dir.mkdir(exist_ok=True)
    base = ["study", "--presets", "tiny_opt_nvme", "--steps", "1"]
    cases = [
        ([f"a={tmp_path / 'missing'}"], "is not a directory (it does not exist)"),
        ([f"a={ro_mnt}"], "cannot write an O_DIRECT file"),
        ([f"a={root_dir}"], "lies on the root drive"),
        ([f"a={mnt / 'x'}", f"b={mnt / 'y'}"], f"share drive {dev}"),
        ([f"a={mnt / 'x'}", f"a={mnt / 'y'}"], "--volume a is named twice"),
        (["nonsense"], "is not NAME=DIR"),
    ]
    try:
        for vols, message in cases:
            out = tmp_path / "study"
            argv = [*base, *(x for v in vols for x in ("--volume", v)), "--out", str(out)]
            p = iotune(*argv, check=False)
            lines = p.stderr.strip().splitlines()
            assert p.returncode != 0 and message in lines[0], (vols, p.stderr)
            assert len(lines) == 2 and lines[1].startswith("hint: "), p.stderr
            assert not out.exists()  # nothing written
        assert list((mnt / "x").iterdir()) == [] and list((mnt / "y").iterdir()) == []
        # --force takes the root drive, as for a run
        p = iotune(*base, "--volume", f"a={root_dir}", "--force", "--dry-run", check=False)
        assert p.returncode == 0, p.stderr
    finally:
        root_dir.rmdir()
