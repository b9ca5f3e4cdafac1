"""The volumes axis of `iotune study`, from pure logic: parsing, distinct drives, the grid
expanded per volume, and the report's rows and step-vs-drives figure from records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.text import Annotation

from iotune.errors import UsageError
from iotune.model.presets import get_preset
from iotune.probes.sysfs import SysTree
from iotune.report import figures as fg
from iotune.report import tables as tb
from iotune.study.plan import Item
from iotune.study.runner import StudySpec
from iotune.study.volumes import Volume, check_distinct, member_faults, parse_volume
from tests.unit.plots import values

SINGLE = Volume("single", "/mnt/a", None, ("nvme0n1",))
RAID2 = Volume("raid0x2", "/mnt/b", "/s", ("nvme1n1", "nvme2n1"), "raid0", 524288, "md0")
RAID4 = Volume("raid0x4", "/mnt/c", None, ("nvme3n1", "nvme4n1", "nvme5n1", "nvme6n1"), "raid0")


def test_volume_options_parse() -> None:
    assert parse_volume("single=/mnt/nvme0") == ("single", "/mnt/nvme0", None)
    assert parse_volume("r=/mnt/md0,aio=results/s") == ("r", "/mnt/md0", "results/s")
    for bad in ("/mnt/nvme0", "=/mnt", "a=", "a b=/mnt"):
        with pytest.raises(UsageError):
            parse_volume(bad)


def test_volumes_are_distinct_by_name_and_drives() -> None:
    check_distinct([SINGLE, RAID2, RAID4])
    with pytest.raises(UsageError, match="share drive nvme1n1"):
        check_distinct([RAID2, Volume("again", "/mnt/x", None, ("nvme1n1",))])
    with pytest.raises(UsageError, match="named twice"):
        check_distinct([SINGLE, Volume("single", "/mnt/y", None, ("sdz",))])
    assert RAID2.describe() == (
        "raid0x2: /mnt/b on raid0 md0 over 2 drive(s) (nvme1n1, nvme2n1, chunk 512 KiB)"
    )
    assert Volume.from_json(RAID2.to_json()) == RAID2


def test_nvme_runs_expand_per_volume_ram_runs_once() -> None:
    items = [Item(get_preset(n)) for n in ("tiny_opt_ram", "tiny_opt_nvme")]
    vols = [SINGLE.to_json(), RAID2.to_json()]
    spec = StudySpec.of(items, "bcc", volumes=vols, aio_config="/study-sweep")
    runs = spec.presets()
    assert [it.name for it in runs] == [
        "tiny_opt_ram",
        "tiny_opt_nvme@single",
        "tiny_opt_nvme@raid0x2",
    ]
    # a volume's own sweep, else the study's
    assert (
        spec.aio_config_for("raid0x2") == "/s" and spec.aio_config_for("single") == "/study-sweep"
    )


def _rec(vol: Volume, step: float, opt: float, io: float, rest: float) -> dict[str, Any]:
    return {
        "preset": "tiny_opt_nvme",
        "run": f"tiny_opt_nvme@{vol.name}",
        "size": "tiny",
        "strategy": "opt_nvme",
        "ga": 1,
        "status": "ok",
        "volume": vol.to_json(),
        "measured": {"step_s": step, "optimizer_s": opt},
        "estimate": {},
        "prediction": {
            "step_s": io + rest,
            "terms": [
                {"what": "read 1 GiB at 1 GiB/s", "seconds": io},
                {"what": "forward + backward (x)", "seconds": rest},
            ],
        },
    }


def test_report_rows_per_volume_and_the_step_against_drives() -> None:
    runs = [_rec(RAID4, 3.0, 1.0, 1.0, 2.0), _rec(SINGLE, 8.0, 6.0, 6.0, 2.0)]
    runs.append(_rec(RAID2, 5.0, 3.0, 3.0, 2.0))
    # ordered by drives, each row named by its volume
    assert [r["run"] for r in tb.sorted_runs(runs)] == [
        "tiny_opt_nvme@single",
        "tiny_opt_nvme@raid0x2",
        "tiny_opt_nvme@raid0x4",
    ]
    _, rows = tb.size_table(runs, "tiny")
    assert [r[0] for r in rows] == [
        "opt_nvme on single (1 drive)",
        "opt_nvme on raid0x2 (raid0, 2 drives)",
        "opt_nvme on raid0x4 (raid0, 4 drives)",
    ]
    d = fg.step_vs_drives(runs)
    assert d is not None
    ax = d.fig.axes[0]
    lines = {ln.get_gid(): ln for ln in ax.get_lines()}
    assert values(lines["measured-opt_nvme"].get_xdata()) == [1, 2, 4]
    assert values(lines["measured-opt_nvme"].get_ydata()) == [8.0, 5.0, 3.0]
    assert values(lines["predicted-opt_nvme"].get_ydata()) == [8.0, 5.0, 3.0]
    # drive-bound on 1 and 2 drives (6 s, 3 s of swaps against 2 s), not on 4 (1 s)
    (mark,) = [t for t in ax.texts if t.get_text() == "no longer drive-bound"]
    assert isinstance(mark, Annotation)
    assert mark.xy == (4, 3.0)
    assert "stops being drive-bound at 4 drives" in d.caption
    # one volume size only: nothing to draw
    assert fg.step_vs_drives(runs[1:2]) is None


def _sysfs(root: Path, files: dict[str, str]) -> SysTree:
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text + "\n")
    return SysTree(root)


def test_a_failing_member_is_named(tmp_path: Path) -> None:
    """After a failed run, the study names what is wrong with the volume's drives (sysfs as
    the kernel writes it: nvme controller state, md member and array state)."""
    well = {
        "sys/block/nvme1n1/device/state": "live",
        "sys/block/nvme2n1/device/state": "live",
        "sys/block/md0/md/array_state": "clean",
        "sys/block/md0/md/dev-nvme1n1/state": "in_sync",
        "sys/block/md0/md/dev-nvme2n1/state": "in_sync",
    }
    assert member_faults(_sysfs(tmp_path / "ok", well), RAID2) == []
    gone = {k: v for k, v in well.items() if "nvme2n1" not in k} | {
        "sys/block/md0/md/array_state": "broken"
    }
    assert member_faults(_sysfs(tmp_path / "gone", gone), RAID2) == [
        "drive nvme2n1 is gone (no /sys/block/nvme2n1)",
        "array md0 is broken",
    ]
    dead = well | {
        "sys/block/nvme1n1/device/state": "dead",
        "sys/block/md0/md/dev-nvme1n1/state": "faulty,write_error",
    }
    assert member_faults(_sysfs(tmp_path / "dead", dead), RAID2) == [
        "drive nvme1n1: its controller is dead",
        "md0 marks its member nvme1n1 faulty",
    ]
    # a plain drive: its own state only
    assert member_faults(_sysfs(tmp_path / "one", {}), SINGLE) == [
        "drive nvme0n1 is gone (no /sys/block/nvme0n1)"
    ]


def test_a_root_on_no_drive_shares_none(tmp_path: Path) -> None:
    """/ on a filesystem no drive backs (here a sysfs tree without the root's device, as in
    a guest whose root is 9p): no volume lies on the root drive, rather than an error."""
    from iotune.study.volumes import root_disks

    assert root_disks(SysTree(tmp_path)) == set()
