"""By-hand counts of the storage planner (`iotune estimate --drives`, iotune.plan.planner):
what it reads of the swept drives from a sysfs tree built here (their PCIe links, the network
links of NVMe-oF namespaces, the health logs), how it picks one drive's bandwidth, and each
figure, label and sentence of the plan it returns. Pure logic over tmp_path trees."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from iotune.errors import UsageError
from iotune.model.dsconfig import ds_config
from iotune.model.estimate import estimate
from iotune.model.presets import get_preset
from iotune.plan.datasheet import Derate, load_profiles, parse_drive
from iotune.plan.drives import Limit
from iotune.plan.measured import AdamRate, Bandwidth, Baseline, RunDrives
from iotune.plan.planner import (
    _health,
    _one_drive,
    _study_steps,
    _swept_disks,
    drive_counts,
    parse_network,
    plan_storage,
    swept_link,
    swept_network,
)
from iotune.probes import nvme_health
from iotune.probes.host import RecordedHost
from iotune.probes.nvme_health import Health
from iotune.probes.sysfs import SysTree
from tests.striping import preset_shares

P1B = get_preset("opt_nvme_1b")
CFG = ds_config(P1B)
E1B = estimate(P1B, CFG)
ADAM = AdamRate(1e-9, 2, 10**9, "threads")  # 1 ns a parameter
BASE = Baseline(4.0, None, "opt_ram run", backward_s=3.0)
#: a sweep of 4 GB/s read, 3 GB/s write
SWEEP = Bandwidth(4e9, 3e9, {}, {"read": 3, "write": 3}, "sweep S")
#: the preset's aio block (configs/presets.toml: 512 KiB, queue depth 8, one thread) over
#: mdadm's 512 KiB chunk: 8 requests x 1 thread x 1 chunk each = 8 members busy
RAID_NOTE = (
    "RAID0 chunk 512 KiB against 8 x 1 request(s) of 512 KiB in flight: at most 8 members "
    "busy (mdadm's default chunk)"
)
NO_MEMORY = "host memory bandwidth: not known (--cpu, --memory-bw or --threads-config sets it)"
NO_LINK = "PCIe link: not reported for the measured drive (--link sets it)"
NO_RATING = "rated endurance: not known (--drive with tbw=, or dwpd= and warranty_years=)"
#: a health log of 11,718,750 data units of 512,000 bytes written (6 TB), 16% of the life
#: used: 6 / 16% = 37.5 TB over the whole life, 31.5 TB left, each printed as a whole TB by
#: rounding the half to the even 38 and 32 (a figure a hair smaller prints 37 and 31)
WORN = Health(
    critical_warning=0,
    temperature_k=310,
    available_spare=100,
    spare_threshold=10,
    percentage_used=16,
    data_units_read=0,
    data_units_written=11_718_750,
    power_on_hours=1000,
    unsafe_shutdowns=0,
    media_errors=0,
)
WORN_NOTE = (
    "endurance from {disk}'s health log: 6.00 TB written, 16% of its life used: about 38 TB in "
    "all, 32 TB left"
)
#: 1,953,525,168 sectors of 512 bytes: a "1 TB" drive of 1,000,204,886,016 bytes
TB1_SECTORS = 1_953_525_168
TB1 = 1_000_204_886_016


def _plan(p: Any = P1B, e: Any = E1B, cfg: Any = CFG, **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "bw": None,
        "adam": None,
        "base": None,
        "aio_config": None,
        "baseline": None,
        "drive": None,
        "drives": "1",
        "target": None,
        "link": None,
        "memory_bw": None,
        "chunk": None,
    }
    out: dict[str, Any] = plan_storage(p, e, cfg, **{**args, **kw})
    return out


def _limits(plan: dict[str, Any]) -> list[tuple[str, float, str, str]]:
    return [(x["what"], x["value"], x["unit"], x["source"]) for x in plan["limits"]]


# ------------------------------------------------------------------ a sysfs tree, built


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _drive(
    root: Path,
    disk: str,
    ctrl: str,
    *,
    sectors: int | None = None,
    pcie: str | None = None,
    pcie_max: str | None = None,
    address: str | None = None,
) -> None:
    """NVMe namespace *disk* of controller *ctrl*: local, its PCI function's link at *pcie*
    ("8.0 GT/s PCIe", 4 lanes; the most it could run at *pcie_max*), or over TCP to
    *address* (traddr=...,trsvcid=...)."""
    block = root / "sys" / "block" / disk
    _w(block / "dev", f"259:{ctrl[4:]}")
    if sectors is not None:
        _w(block / "size", str(sectors))
    c = root / "sys" / "class" / "nvme" / ctrl
    _w(c / "transport", "tcp" if address else "pcie")
    _w(c / "state", "live")
    if address:
        _w(c / "address", address)
    if pcie:
        _w(c / "device" / "current_link_speed", pcie)
        _w(c / "device" / "current_link_width", "4")
        _w(c / "device" / "max_link_speed", pcie_max or pcie)
    (block / "device").symlink_to(os.path.relpath(c, block))


def _on(root: Path, target: Path, name: str, members: tuple[str, ...] = ()) -> None:
    """*target* (a folder of this machine) is on block device *name* (an array of *members*):
    the tree's /sys/dev/block entry of the folder's device number names it."""
    st = os.stat(target)
    link = root / "sys" / "dev" / "block" / f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    link.parent.mkdir(parents=True)
    block = root / "sys" / "block" / name
    if members:
        _w(block / "dev", "9:0")
        for m in members:
            (block / "slaves" / m).mkdir(parents=True)
    link.symlink_to(os.path.relpath(block, link.parent))


def _sweep(where: Path, target: Path | None) -> str:
    """A sweep-aio run of *target*: the planner reads its target here, not its points."""
    where.mkdir()
    (where / "points.jsonl").write_text("")
    spec = {"target": str(target)} if target else {}
    (where / "sweep.json").write_text(json.dumps({"spec": spec}))
    return str(where)


def _host(root: Path, routes: dict[str, str] | None = None) -> RecordedHost:
    if routes:
        (root / "probes.json").write_text(json.dumps({"routes": routes}))
    return RecordedHost(root)


@pytest.fixture
def pcie_array(tmp_path: Path) -> tuple[str, RecordedHost]:
    """A sweep of a folder on md0, a RAID0 of nvme0n1 (PCIe 4.0 x4) and nvme1n1 (PCIe 3.0
    x4, 1 TB): (the sweep, the host)."""
    root, target = tmp_path / "root", tmp_path / "offload"
    target.mkdir()
    _drive(root, "nvme0n1", "nvme0", pcie="16.0 GT/s PCIe")
    _drive(root, "nvme1n1", "nvme1", pcie="8.0 GT/s PCIe", sectors=TB1_SECTORS)
    _on(root, target, "md0", ("nvme0n1", "nvme1n1"))
    return _sweep(tmp_path / "sweep", target), _host(root)


# ------------------------------------------------------------------ the swept drives


def test_the_swept_array_is_its_member_drives(pcie_array: tuple[str, RecordedHost]) -> None:
    sweep, host = pcie_array
    assert _swept_disks(sweep, host=host) == ["nvme0n1", "nvme1n1"]


def test_no_sweep_or_a_sweep_without_a_target_has_no_drives(tmp_path: Path) -> None:
    host = _host(tmp_path / "root")
    assert _swept_disks(None, host=host) == []
    assert _swept_disks(str(tmp_path), host=host) == []  # a folder without points.jsonl
    assert _swept_disks(_sweep(tmp_path / "sweep", None), host=host) == []
    # a target whose device the tree does not know: "not on a block device", no drives
    assert _swept_disks(_sweep(tmp_path / "s2", tmp_path), host=host) == []


def test_the_slowest_members_pcie_link_bounds_each_drive(
    pcie_array: tuple[str, RecordedHost],
) -> None:
    sweep, host = pcie_array
    # PCIe 3.0: 8 GT/s x 128/130 line code / 8 bits = 0.985 GB/s a lane, x 4 lanes = 3.94 GB/s
    # (nvme0n1's PCIe 4.0 x4 is twice that)
    assert swept_link(sweep, host=host) == Limit(
        "PCIe link 8.0 GT/s x4 per drive", 3.94e9, "B/s", "sysfs of nvme0n1, nvme1n1"
    )


def test_members_whose_links_run_at_the_same_rate_give_that_rate(tmp_path: Path) -> None:
    root, target = tmp_path / "root", tmp_path / "offload"
    target.mkdir()
    _drive(root, "nvme0n1", "nvme0", pcie="16.0 GT/s PCIe")
    # a PCIe 5.0 drive in a 4.0 slot: it runs at 16 GT/s as the other does
    _drive(root, "nvme1n1", "nvme1", pcie="16.0 GT/s PCIe", pcie_max="32.0 GT/s PCIe")
    _on(root, target, "md0", ("nvme0n1", "nvme1n1"))
    # PCIe 4.0: 16 GT/s x 128/130 / 8 = 1.969 GB/s a lane, x 4 = 7.876 GB/s
    assert swept_link(_sweep(tmp_path / "sweep", target), host=_host(root)) == Limit(
        "PCIe link 16.0 GT/s x4 per drive", 7.876e9, "B/s", "sysfs of nvme0n1, nvme1n1"
    )


def test_a_member_without_a_reported_link_leaves_the_link_unknown(tmp_path: Path) -> None:
    root, target = tmp_path / "root", tmp_path / "offload"
    target.mkdir()
    _drive(root, "nvme0n1", "nvme0", pcie="16.0 GT/s PCIe")
    _drive(root, "nvme1n1", "nvme1")  # an emulated controller reports none
    _on(root, target, "md0", ("nvme0n1", "nvme1n1"))
    sweep, host = _sweep(tmp_path / "sweep", target), _host(root)
    assert swept_link(sweep, host=host) is None
    assert swept_link(None, host=host) is None


@pytest.fixture
def tcp_array(tmp_path: Path) -> tuple[str, RecordedHost]:
    """A sweep of a folder on md0, a RAID0 of two NVMe/TCP namespaces: nvme0n1 to 10.0.0.2
    routed by eth0 (100 Gb/s), nvme1n1 to 10.0.0.3 routed by eth1 (25 Gb/s)."""
    root, target = tmp_path / "root", tmp_path / "offload"
    target.mkdir()
    _drive(root, "nvme0n1", "nvme0", address="traddr=10.0.0.2,trsvcid=4420")
    _drive(root, "nvme1n1", "nvme1", address="traddr=10.0.0.3,trsvcid=4420")
    _w(root / "sys" / "class" / "net" / "eth0" / "speed", "100000")
    _w(root / "sys" / "class" / "net" / "eth1" / "speed", "25000")
    _on(root, target, "md0", ("nvme0n1", "nvme1n1"))
    host = _host(root, {"10.0.0.2": "eth0", "10.0.0.3": "eth1"})
    return _sweep(tmp_path / "sweep", target), host


def test_the_slowest_network_link_is_in_front_of_nvme_of_drives(
    tcp_array: tuple[str, RecordedHost],
) -> None:
    sweep, host = tcp_array
    # eth1: 25,000 Mb/s x 10^6 / 8 bits = 3.125 GB/s (eth0's 100 Gb/s is 12.5 GB/s)
    assert swept_network(sweep, host=host) == Limit(
        "network link eth1 25 Gb/s", 3.125e9, "B/s", "sysfs, nvme-tcp 10.0.0.3:4420 (eth1 25 Gb/s)"
    )
    # and NVMe/TCP namespaces report no PCIe link
    assert swept_link(sweep, host=host) is None


def test_a_network_link_is_only_that_of_namespaces_that_report_a_speed(tmp_path: Path) -> None:
    root, target = tmp_path / "root", tmp_path / "offload"
    target.mkdir()
    _drive(root, "nvme0n1", "nvme0", pcie="16.0 GT/s PCIe")  # local: no fabric
    _drive(root, "nvme1n1", "nvme1", address="traddr=10.0.0.4,trsvcid=4420,host_iface=eth2")
    _drive(root, "nvme2n1", "nvme2", address="traddr=10.0.0.5,trsvcid=4420,host_iface=eth3")
    _w(root / "sys" / "class" / "net" / "eth2" / "speed", "-1")  # a virtual NIC's "unknown"
    _w(root / "sys" / "class" / "net" / "eth3" / "speed", "10000")
    _on(root, target, "md0", ("nvme0n1", "nvme1n1", "nvme2n1"))
    sweep, host = _sweep(tmp_path / "sweep", target), _host(root)
    # 10,000 Mb/s / 8 = 1.25 GB/s
    assert swept_network(sweep, host=host) == Limit(
        "network link eth3 10 Gb/s", 1.25e9, "B/s", "sysfs, nvme-tcp 10.0.0.5:4420 (eth3 10 Gb/s)"
    )


def test_namespaces_without_a_link_speed_give_no_network_link(tmp_path: Path) -> None:
    root, target = tmp_path / "root", tmp_path / "offload"
    target.mkdir()
    _drive(root, "nvme1n1", "nvme1", address="traddr=10.0.0.4,trsvcid=4420,host_iface=eth2")
    _w(root / "sys" / "class" / "net" / "eth2" / "speed", "-1")
    _on(root, target, "nvme1n1")
    sweep, host = _sweep(tmp_path / "sweep", target), _host(root)
    assert _swept_disks(sweep, host=host) == ["nvme1n1"]
    assert swept_network(sweep, host=host) is None
    assert swept_network(None, host=host) is None


def test_a_sweep_of_nvme_of_drives_is_planned_behind_their_network_link(
    tcp_array: tuple[str, RecordedHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep, host = tcp_array
    monkeypatch.setattr(nvme_health, "read_health", lambda c: None)  # not this host's /dev
    plan = _plan(bw=SWEEP, aio_config=sweep, drives="1,2", memory_bw=95, host=host)
    assert _limits(plan)[2:] == [
        ("host memory", 95 * 2**30, "B/s", "--memory-bw"),
        (
            "network link eth1 25 Gb/s",
            3.125e9,
            "B/s",
            "sysfs, nvme-tcp 10.0.0.3:4420 (eth1 25 Gb/s)",
        ),
    ]
    assert plan["missing"] == [NO_LINK, NO_RATING]  # no PCIe link, no health log read
    # a drive is half the sweep, 2 GB/s read and 1.5 write: two of them read 4 GB/s, past
    # eth1's 3.125 GB/s, and write 3 GB/s (at the stripe's share), within it
    _, ws = preset_shares(P1B, 2)
    assert [
        (p["bound_by"], p["read_bw_bytes_s"], p["write_bw_bytes_s"]) for p in plan["plans"]
    ] == [
        ("drives", 2e9, 1.5e9),
        ("read: network link, write: drives", 3.125e9, pytest.approx(3e9 * ws, abs=1)),
    ]


def test_the_first_drive_whose_health_log_and_size_are_read_is_the_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    _drive(root, "nvme0n1", "nvme0", sectors=TB1_SECTORS)  # its log cannot be read
    _drive(root, "nvme1n1", "nvme1")  # its log is read, its size is not
    _drive(root, "nvme2n1", "nvme2", sectors=TB1_SECTORS)
    _w(root / "sys" / "block" / "vda" / "size", "100")  # no NVMe controller
    logs = {"nvme1": WORN, "nvme2": WORN}
    monkeypatch.setattr(nvme_health, "read_health", logs.get)
    disks = ["vda", "nvme0n1", "nvme1n1", "nvme2n1"]
    host = _host(root)
    # 1,953,525,168 sectors x 512 bytes
    assert _health(disks, host=host) == ("nvme2n1", WORN, 1_000_204_886_016.0)
    assert _health(disks[:3], host=host) is None


# ------------------------------------------------------------------ the small parsers


@pytest.mark.parametrize("bad", ["two", "0,2", ",", "1,-1"])
def test_drive_counts_are_refused_with_the_default_list_as_hint(bad: str) -> None:
    with pytest.raises(UsageError) as exc:
        drive_counts(bad)
    assert exc.value.message == f"--drives {bad!r} is not a list of drive counts"
    assert exc.value.hint == "--drives 1,2,4,8"


def test_drive_counts_are_sorted_once_each() -> None:
    assert drive_counts("8, 2,2,1,") == [1, 2, 8]


def test_a_network_link_in_gigabits_by_trade_or_bytes_with_their_unit() -> None:
    assert parse_network("400 Gbit") == 50e9  # 400 Gb/s / 8 bits
    assert parse_network("25GbE") == 3.125e9  # 25 Gb/s / 8
    assert parse_network("12.5GB/s") == 12.5e9


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        ("fast", "--network-link 'fast' is not a rate", "write it with its unit, e.g. "),
        ("100 GB", "--network-link '100 GB' is a size, not a rate", "add /s, e.g. "),
    ],
)
def test_a_network_link_that_is_no_rate_is_refused_with_the_links_examples(
    text: str, message: str, hint: str
) -> None:
    with pytest.raises(UsageError) as exc:
        parse_network(text)
    assert exc.value.message == message
    assert exc.value.hint == hint + "100G, 25GbE or 12.5GB/s"


# ------------------------------------------------------------------ one drive's bandwidth

DEFAULT = Derate(0.77, 0.74, "DeepSpeed's ratio")
#: a RAID0 of 2 whose swaps ran at 3 GB/s read, 2 GB/s write: 1.5 and 1 GB/s a drive
RAN = RunDrives(3e9, 2e9, 2, "RUN")
SPEC = parse_drive("read=7GB/s,write=5GB/s")


def test_without_any_bandwidth_the_plan_names_the_three_ways_in() -> None:
    with pytest.raises(UsageError) as exc:
        _one_drive(None, None, None, DEFAULT)
    assert exc.value.message == (
        "--drives plans from one drive's bandwidth: name a sweep (--aio-config), a run of the "
        "optimizer state on NVMe (--baseline) or a datasheet (--drive)"
    )
    assert exc.value.hint == (
        "iotune sweep-aio --target /mnt/nvme0 --out SWEEP; then --aio-config SWEEP, or "
        "--drive samsung-980-pro-2tb"
    )


def test_a_runs_swaps_give_one_drives_share_of_its_volume() -> None:
    one, derate = _one_drive(None, RAN, None, DEFAULT)
    assert (one.read, one.write, one.source, one.pattern) == (1.5e9, 1e9, "RUN", "run")
    assert derate is None


def test_a_runs_swaps_derate_a_datasheet_which_then_gives_the_drive() -> None:
    one, derate = _one_drive(None, RAN, SPEC, DEFAULT)
    # 1.5 of 7 GB/s read, 1 of 5 GB/s write
    assert derate == Derate(1.5 / 7, 1 / 5, "measured / datasheet: RUN", measured=True)
    assert one.read == pytest.approx(1.5e9) and one.write == pytest.approx(1e9)
    assert (one.source, one.pattern) == ("--drive datasheet", "datasheet")
    assert one.derate == pytest.approx((1.5 / 7, 0.2))


def test_a_sweep_stays_the_drive_beside_a_datasheet_and_measures_its_derating() -> None:
    one, derate = _one_drive(SWEEP, RAN, SPEC, DEFAULT)
    assert one == SWEEP
    assert derate == Derate(4 / 7, 3 / 5, "measured / datasheet: sweep S", measured=True)
    assert _one_drive(SWEEP, None, None, DEFAULT) == (SWEEP, None)


def test_a_datasheet_alone_is_derated_by_the_published_ratio() -> None:
    one, derate = _one_drive(None, None, SPEC, DEFAULT)
    assert derate == DEFAULT
    # 7 GB/s x 0.77, 5 GB/s x 0.74
    assert (one.read, one.write) == pytest.approx((5.39e9, 3.7e9))


def test_the_studys_steps_are_its_16b_rows_at_accumulation_1() -> None:
    # configs/study.toml: opt_nvme 107.71 s on one drive, opt_raid0 49.66 s on 3
    assert _study_steps(get_preset("opt_nvme_16b")) == ((1, 107.71), (3, 49.66))
    assert _study_steps(get_preset("opt_nvme_16b_ga4")) == ()
    assert _study_steps(replace(get_preset("opt_nvme_16b"), size="")) == ()
    assert _study_steps(P1B) == ()


def test_a_raid0_preset_is_given_the_studys_one_drive_step_for_one_drive() -> None:
    # the same model and strategy: one drive is the study's opt_nvme row (107.71 s), three its
    # opt_raid0 row (49.66 s), whichever of the two presets is planned; and the parameters'
    # rows (configs/study.toml: 138.98 s on one, 64.41 s on three) for params_opt_*
    assert _study_steps(get_preset("opt_raid0_16b")) == ((1, 107.71), (3, 49.66))
    assert _study_steps(get_preset("params_opt_raid0_16b")) == ((1, 138.98), (3, 64.41))
    assert _study_steps(get_preset("params_opt_nvme_16b")) == ((1, 138.98), (3, 64.41))


# ------------------------------------------------------------------ the plan


@pytest.mark.parametrize(("size", "example"), [("16b", "opt_nvme_16b"), ("", "opt_nvme_1b")])
def test_a_preset_off_nvme_has_no_drives_to_plan(size: str, example: str) -> None:
    p = replace(get_preset("opt_ram_16b"), size=size)
    with pytest.raises(UsageError) as exc:
        _plan(p, drive="samsung-980-pro-2tb")
    assert exc.value.message == (
        "opt_ram_16b keeps its optimizer state and parameters off NVMe (opt_ram): --drives "
        "plans the drives a run swaps to"
    )
    assert exc.value.hint == (
        f"plan a preset that swaps to NVMe, e.g. {example}, or --checkpoint-every for a "
        "checkpoint volume"
    )


def test_a_sweep_of_an_array_plans_from_one_members_share_and_its_sysfs(
    pcie_array: tuple[str, RecordedHost], monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep, host = pcie_array
    monkeypatch.setattr(nvme_health, "read_health", lambda c: WORN if c == "nvme1" else None)
    plan = _plan(bw=SWEEP, adam=ADAM, base=BASE, aio_config=sweep, drives="2,1", host=host)
    # 4 and 3 GB/s over the array's 2 members
    share = "sweep S, one of its 2 drives (nvme0n1, nvme1n1)"
    assert _limits(plan) == [
        ("one drive, read (measured)", 2e9, "B/s", share),
        ("one drive, write (measured)", 1.5e9, "B/s", share),
        ("PCIe link 8.0 GT/s x4 per drive", 3.94e9, "B/s", "sysfs of nvme0n1, nvme1n1"),
        # 1 ns x the 1B preset's 1,235,814,400 parameters; the baseline's 4 s
        ("CPU Adam, 1.24B parameters at 2 thread(s)", 1.2358144, "s", "measured"),
        ("forward + backward", 4.0, "s", "opt_ram run"),
    ]
    assert plan["limits"][0]["text"] == f"one drive, read (measured): 1.86 GiB/s ({share})"
    # nvme0's log is not read: nvme1n1's, 1 TB
    assert plan["notes"] == [RAID_NOTE, WORN_NOTE.format(disk="nvme1n1")]
    assert plan["missing"] == [NO_MEMORY]
    assert plan["capacity_bytes"] == TB1
    assert [p["drives"] for p in plan["plans"]] == [1, 2]
    # 2 GB/s read, 1.5 GB/s write a drive; two at the stripe's share of twice that (the
    # sweep's own files were a plain sweep's: it measured the members' whole rate)
    rs, ws = preset_shares(P1B, 2)
    assert 0.9999 < min(rs, ws) < 1  # the 1B preset's files: hardly any loss on two
    assert [(p["read_bw_bytes_s"], p["write_bw_bytes_s"]) for p in plan["plans"]] == [
        (2e9, 1.5e9),
        (pytest.approx(4e9 * rs, abs=1), pytest.approx(3e9 * ws, abs=1)),
    ]
    for p in plan["plans"]:
        en = p["endurance"]
        per_day = en["write_bytes_per_drive_day"]
        assert p["fits"] is True  # 1 TB a drive holds the 19.8 GB on NVMe
        assert en["days_to_rated_writes"] == round(31.5e12 / per_day, 1)  # the log's 31.5 TB left
        assert en["dwpd"] == round(per_day / TB1, 3)
    assert (plan["drive"], plan["derate"], plan["nvme_bytes"]) == (None, None, 19_772_760_064)
    assert plan["baseline"] == {"kind": "ram", "source": "opt_ram run"}
    assert "target" not in plan and "study" not in plan


def test_a_sweep_of_one_drive_is_that_drive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its health log too worn to extrapolate from (0% used), and one past its rated life
    (200%: the 6 TB written are twice the 3 TB it was rated for, none left)."""
    root, target = tmp_path / "root", tmp_path / "offload"
    target.mkdir()
    _drive(root, "nvme0n1", "nvme0", sectors=TB1_SECTORS)
    _on(root, target, "nvme0n1")
    sweep, host = _sweep(tmp_path / "sweep", target), _host(root)
    logs = {"nvme0": replace(WORN, percentage_used=0)}
    monkeypatch.setattr(nvme_health, "read_health", logs.get)
    plan = _plan(bw=SWEEP, adam=ADAM, base=BASE, aio_config=sweep, host=host)
    assert _limits(plan)[:2] == [
        ("one drive, read (measured)", 4e9, "B/s", "sweep S"),
        ("one drive, write (measured)", 3e9, "B/s", "sweep S"),
    ]
    assert plan["notes"][1] == (
        "endurance from nvme0n1's health log: 6.00 TB written, 0% of its life used (too "
        "little wear to extrapolate its rated writes; --drive tbw= sets them)"
    )
    # its controller reports no PCIe link; the log gives no rating, but it was read
    assert plan["missing"] == [NO_LINK, NO_MEMORY]
    assert plan["plans"][0]["endurance"]["days_to_rated_writes"] is None
    assert plan["plans"][0]["endurance"]["dwpd"] is not None
    logs["nvme0"] = replace(WORN, percentage_used=200)
    plan = _plan(bw=SWEEP, adam=ADAM, base=BASE, aio_config=sweep, host=host)
    assert plan["notes"][1] == (
        "endurance from nvme0n1's health log: 6.00 TB written, 200% of its life used: about "
        "3 TB in all, 0 TB left"
    )
    assert plan["missing"] == [NO_LINK, NO_MEMORY]
    # none left: 0 days, not an unknown
    assert plan["plans"][0]["endurance"]["days_to_rated_writes"] == 0.0


def test_a_datasheet_with_an_slc_cache_says_where_each_figure_comes_from() -> None:
    profiles, default = load_profiles()
    spec = profiles["wd-blue-sn580-1tb"]
    plan = _plan(drive="wd-blue-sn580-1tb", drives="2,1", target="60", memory_bw=0.5)
    src = "wd-blue-sn580-1tb datasheet"
    assert _limits(plan) == [
        # 4,150 MB/s x DeepSpeed's 0.77 read and 0.74 write
        ("one drive, read (datasheet)", 3.1955e9, "B/s", src),
        ("one drive, write (datasheet)", 3.071e9, "B/s", src),
        ("PCIe link 16GT/s x4 per drive", 7.876e9, "B/s", src),
        ("host memory", 2**29, "B/s", "--memory-bw"),  # half a GiB/s
    ]
    # half a GiB/s of memory is below one drive each way: it bounds every count
    assert [
        (p["bound_by"], p["read_bw_bytes_s"], p["write_bw_bytes_s"]) for p in plan["plans"]
    ] == [
        ("memory", 2**29, 2**29),
        ("memory", 2**29, 2**29),
    ]
    assert plan["notes"] == [
        f"derating of the datasheet: x 0.77 read, x 0.74 write ({default.source})",
        RAID_NOTE,
        f"datasheet: WD Blue SN580 1 TB, DRAM-less (64 MB host memory buffer): {spec.source}",
        # 341 GB, 450 MB/s
        f"SLC cache 341 GB a drive, then 450 MB/s ({spec.cache_source}); the cache counted "
        "empty at each step",
    ]
    assert plan["missing"] == []  # the profile rates 600 TBW
    assert plan["capacity_bytes"] == 1e12
    assert plan["drive"] == spec.to_json()
    assert plan["derate"] == {
        "read": 0.77,
        "write": 0.74,
        "source": default.source,
        "measured": False,
    }
    assert plan["baseline"] is None
    # neither CPU Adam nor a step without --threads-config or --baseline: no answer
    assert plan["target"] == {
        "asked": "60",
        "step_s": None,
        "drives": None,
        "answer": "no answer: CPU Adam not measured: pass --threads-config (or --baseline)",
    }


def test_a_profiles_slc_cache_given_by_the_user_is_noted_in_whole_gb_and_mb_s() -> None:
    text = "wd-blue-sn580-1tb,cache=341.5GB,after_cache=451.5MB/s"
    plan = _plan(drive=text)
    # 341.5 GB and 451.5 MB/s each round the half to the even 342 and 452 (a figure a hair
    # smaller would print 341 and 451)
    assert plan["notes"][3] == (
        f"SLC cache 342 GB a drive, then 452 MB/s ({parse_drive(text).cache_source}); the "
        "cache counted empty at each step"
    )


def test_what_the_user_gives_is_each_limit_in_order_with_its_option() -> None:
    profiles, _ = load_profiles()
    spec = profiles["samsung-980-pro-2tb"]
    cfg = {"aio": {"block_size": 2 << 20, "queue_depth": 2, "intra_op_parallelism": 3}}
    plan = _plan(
        cfg=cfg,
        drive="samsung-980-pro-2tb",
        link=" 8GT/s x4 ",  # as a shell variable may hand it: named without the spaces
        memory_bw=95,
        network="25GbE ",
        chunk="64K",
    )
    assert _limits(plan)[2:] == [
        # --link over the datasheet's PCIe 4.0: 4 lanes of 0.985 GB/s
        ("PCIe link 8GT/s x4 per drive", 3.94e9, "B/s", "--link"),
        ("host memory", 95 * 2**30, "B/s", "--memory-bw"),  # 95 GiB/s
        ("network link 25GbE", 3.125e9, "B/s", "--network-link"),  # 25 Gb/s / 8
    ]
    assert [x["text"] for x in plan["limits"][3:]] == [
        "host memory: 95.00 GiB/s (--memory-bw)",
        "network link 25GbE: 2.91 GiB/s (--network-link)",  # 3.125e9 / 2^30
    ]
    # 2 requests x 3 threads, each 2 MiB request over 32 chunks of 64 KiB: 192 members
    assert plan["notes"][1:] == [
        "RAID0 chunk 64 KiB against 2 x 3 request(s) of 2 MiB in flight: at most 192 members "
        "busy (--chunk)",
        f"datasheet: Samsung 980 PRO 2 TB (MZ-V8P2T0), the study's class: {spec.source}",
        f"SLC cache: {spec.cache_source}",
    ]
    assert plan["missing"] == []
    assert plan["capacity_bytes"] == 2e12


def test_nothing_is_looked_up_on_the_host_when_the_user_gives_every_figure(
    pcie_array: tuple[str, RecordedHost],
) -> None:
    """A datasheet (its link, capacity and rating) and --network-link: the swept drives'
    sysfs is not read, for their share, link, network link or health log."""
    sweep, host = pcie_array
    host.tree = SysTree(host.tree.root, record=True)
    plan = _plan(aio_config=sweep, drive="samsung-980-pro-2tb", network="25GbE", host=host)
    assert host.tree.touched == set()
    assert plan["missing"] == [NO_MEMORY]


def test_without_an_aio_block_the_array_is_planned_for_deepspeeds_defaults() -> None:
    p = replace(P1B, deepspeed={})
    plan = _plan(p, cfg={}, drive="read=7GB/s,write=5GB/s")
    # DeepSpeed's aio defaults: 1 MiB blocks, queue depth 8, one thread; over mdadm's 512 KiB
    # chunk each request spans 2 members: 8 x 1 x 2 = 16
    assert plan["notes"][1] == (
        "RAID0 chunk 512 KiB against 8 x 1 request(s) of 1 MiB in flight: at most 16 members "
        "busy (mdadm's default chunk)"
    )
    # a key list is no profile: no datasheet notes; it has no link and no rating
    assert len(plan["notes"]) == 2
    assert plan["missing"] == [NO_LINK, NO_MEMORY, NO_RATING]
    assert plan["capacity_bytes"] is None
    assert _limits(plan)[0] == (
        "one drive, read (datasheet)",
        5.39e9,  # 7 GB/s x 0.77
        "B/s",
        "--drive datasheet",
    )


@pytest.mark.parametrize("bad", [0, -1, 100_001])
def test_a_memory_bandwidth_outside_what_a_host_has_is_refused(bad: float) -> None:
    with pytest.raises(UsageError) as exc:
        _plan(drive="read=7GB/s,write=5GB/s", memory_bw=bad)
    assert exc.value.message == (
        f"--memory-bw must be the host's memory bandwidth in GiB/s, got {bad}"
    )
    assert exc.value.hint == "--memory-bw 95 (dual-channel DDR5-6400: 102.4 GB/s)"


def _run(where: Path) -> str:
    """An NVMe run of the 1B preset on two drives: 12 x 10^9 bytes swapped (n_s = 10^9)
    each way, in 9 - 1 = 8 s of reads and 1 + 1 + 6 = 8 s of writes: 1.5 GB/s of the
    volume, 0.75 GB/s a drive."""
    ev = {"event": "step", "forward_s": 1.0, "backward_s": 2.0, "optimizer_s": 20.0}
    ev.update({"grad_out_s": 1.0, "swap_in_s": 9.0, "grad_flush_s": 1.0, "swap_out_s": 6.0})
    doc = {
        "preset": "opt_nvme_1b",
        "strategy": "opt_nvme",
        "drives": ["nvme0n1", "nvme1n1"],
        "estimate": {"swapped": {"n_s": 10**9, "n_g": 0}},
        "events": [dict(ev, step=1), dict(ev, step=2)],
    }
    where.mkdir()
    (where / "run.json").write_text(json.dumps(doc))
    return str(where)


def test_a_runs_drives_give_the_bandwidth_and_their_health_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _run(tmp_path / "run")
    root = tmp_path / "root"
    _drive(root, "nvme0n1", "nvme0", sectors=TB1_SECTORS)
    monkeypatch.setattr(nvme_health, "read_health", lambda c: WORN if c == "nvme0" else None)
    plan = _plan(baseline=run, memory_bw=100_000, host=_host(root))
    src = f"opt_nvme_1b ({run}, 2 drives)"
    # the run's 1.5 GB/s on two drives was the stripe's share of their rate
    rs, ws = preset_shares(P1B, 2, parameters=False)
    assert _limits(plan) == [
        ("one drive, read (measured)", pytest.approx(0.75e9 / rs), "B/s", src),
        ("one drive, write (measured)", pytest.approx(0.75e9 / ws), "B/s", src),
        ("host memory", 100_000 * 2**30, "B/s", "--memory-bw"),
    ]
    assert plan["notes"] == [RAID_NOTE, WORN_NOTE.format(disk="nvme0n1")]
    assert plan["missing"] == [NO_LINK]
    # a sweep is the drive where both are given; the run's drives still have the log
    plan = _plan(bw=SWEEP, baseline=run, host=_host(root))
    assert _limits(plan)[0] == ("one drive, read (measured)", 4e9, "B/s", "sweep S")
    assert plan["notes"][1] == WORN_NOTE.format(disk="nvme0n1")


def test_a_runs_swaps_against_a_datasheet_derate_it(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    plan = _plan(cfg={}, baseline=run, drive="samsung-980-pro-2tb", link="16GT/s x4")
    assert plan["notes"][1] == RAID_NOTE  # a config without aio: the preset's
    src = f"opt_nvme_1b ({run}, 2 drives)"
    sheet = "samsung-980-pro-2tb datasheet"
    assert _limits(plan)[:2] == [
        ("one drive, read (datasheet)", 0.75e9, "B/s", sheet),
        ("one drive, write (datasheet)", 0.75e9, "B/s", sheet),
    ]
    # 0.75 of 7 GB/s is 0.107, of 5.1 GB/s 0.147
    assert plan["notes"][0] == (
        f"derating of the datasheet: x 0.11 read, x 0.15 write (measured / datasheet: {src})"
    )
    assert plan["derate"]["measured"] is True


def test_a_target_step_is_answered_with_the_fewest_drives() -> None:
    plan = _plan(bw=Bandwidth(2e9, 1.5e9, {}, {}, "sweep"), adam=ADAM, base=BASE, target="1.5x")
    # the step without drive waits: 4 s forward + backward and 1.236 s of CPU Adam, x 1.5 =
    # 7.854 s; the swaps (18.41 GiB read at 2 GB/s, 13.81 GiB written at 1.5 GB/s: 9.89 s
    # each on one drive) fit the 2.618 s left from 19.77 / 2.618 = 7.6, so 8 drives; their
    # step adds the gradients' last reduce bucket, written after backward: 4.94 GB at 12 GB/s
    # is 0.412 s, of which the last bucket (1,235,814,400 - 2 x 500M elements, 0.1908 of
    # them) 0.079 s, for 4 + 1.236 + 19.77 / 8 + 0.079 = 7.786 s
    target = plan["target"]
    assert (target["asked"], target["step_s"], target["drives"]) == ("1.5x", 7.854, 8)
    # a bandwidth alone, without its sweep, run or datasheet: no link, capacity or rating
    assert plan["capacity_bytes"] is None
    assert plan["missing"] == [NO_LINK, NO_MEMORY, NO_RATING]
    assert target["answer"].startswith("8 drive(s): 7.79 s predicted, within 7.85 s ")


def test_the_studys_own_model_is_planned_beside_its_measured_steps() -> None:
    p = get_preset("opt_nvme_16b")
    plan = _plan(p, estimate(p, ds_config(p)), ds_config(p), bw=SWEEP, drives="1,3")
    assert plan["study"] == {"case": "Opt-state to NVMe", "step_s": 107.71}
    assert [x["study_step_s"] for x in plan["plans"]] == [107.71, 49.66]


def test_the_hosts_memory_from_a_thread_sweep_bounds_the_drives_unless_a_figure_is_given() -> None:
    """sweep-threads measures the host's memory (STREAM's triad): where neither --memory-bw
    nor --cpu gives it, that figure is the ceiling of every swapped byte; a figure the user
    gives comes first (--memory-bw, then --cpu's theoretical rate)."""
    from iotune.plan.cpus import parse_cpu

    measured = (10e9, "RUN/threads.json: STREAM triad at 2 thread(s)")
    plan = _plan(drive="read=7GB/s,write=5GB/s", drives="1,2", memory_measured=measured)
    assert _limits(plan)[2:] == [
        ("host memory (measured)", 10e9, "B/s", "RUN/threads.json: STREAM triad at 2 thread(s)")
    ]
    assert NO_MEMORY not in plan["missing"]
    # one drive reads 7 GB/s derated by DeepSpeed's published 0.77: 5.39; two would read
    # 10.78, past the memory's 10
    assert [(p["bound_by"], p["read_bw_bytes_s"]) for p in plan["plans"]] == [
        ("drives", 5.39e9),
        ("read: memory, write: drives", 10e9),
    ]
    cpu = parse_cpu("cores=8,memory=20GB/s")
    both = _plan(drive="read=7GB/s,write=5GB/s", memory_measured=measured, cpu=cpu)
    assert _limits(both)[2:] == [
        (
            "host memory, 1 x a CPU of 8 cores: 8 cores, 20.0 GB/s (theoretical)",
            20e9,
            "B/s",
            "--cpu",
        )
    ]
    given = _plan(drive="read=7GB/s,write=5GB/s", memory_measured=measured, cpu=cpu, memory_bw=5)
    assert _limits(given)[2:] == [("host memory", 5 * 2**30, "B/s", "--memory-bw")]


def test_a_plan_on_a_two_socket_host_names_the_swaps_that_cross_sockets(
    pcie_array: tuple[str, RecordedHost], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swept md0's members hang off both sockets (nvme0 on node 0, nvme1 on node 1) and
    the GPU off node 0: the plan says every rank's swaps cross for the other socket's share,
    beside the chunk's note; the tree as iotune/probes/topology.py reads it."""
    sweep, host = pcie_array
    monkeypatch.setattr(nvme_health, "read_health", lambda c: None)
    root = tmp_path / "root"
    for n in (0, 1):
        _w(root / f"sys/devices/system/node/node{n}/cpulist", f"{2 * n}-{2 * n + 1}")
        _w(root / f"sys/class/nvme/nvme{n}/device/numa_node", str(n))
    for key, value in (("vendor", "0x10de"), ("class", "0x030200"), ("numa_node", "0")):
        _w(root / f"sys/bus/pci/devices/0000:18:00.0/{key}", value)
    plan = _plan(bw=SWEEP, aio_config=sweep, drives="1", memory_bw=95, host=host)
    assert plan["notes"][1] == (
        "NUMA: node 0 2 CPUs, node 1 2 CPUs; rank(s) 0 on GPUs of node 0; the swept volume "
        "stripes over drives of 2 sockets (nvme0n1 node 0, nvme1n1 node 1): every rank's swaps "
        "cross sockets for the share on the other socket's drives (what crossing costs is not "
        "measured here)"
    )


def test_each_rows_wait_on_drives_is_of_the_step_its_row_prints() -> None:
    """The table's WAIT ON DRIVES says "W s of S s" with S the row's STEP s as printed, not
    a sum of two parts rounded apart (the README's eight ranks printed 16.81 beside "of
    16.80 s")."""
    import re

    from click.testing import CliRunner

    from iotune import cli as cli_mod

    args = ["estimate", "opt_nvme_16b", "--set", "model.num_hidden_layers=60"]
    args += ["--set", "ds.aio.queue_depth=16", "--ranks", "8"]
    args += ["--cpu", "intel-xeon-8480+,sockets=2", "--drive", "samsung-980-pro-2tb"]
    args += ["--baseline", "study", "--drives", "8,16,24,32,48,64", "--target-step", "1.5x"]
    out = CliRunner().invoke(cli_mod.cli, args, prog_name="iotune", env={"COLUMNS": "300"})
    assert out.exit_code == 0, out.output
    rows = re.findall(r"(\d+\.\d\d) +[\d.]+ s of (\d+\.\d\d) s", out.output)
    assert len(rows) == 6, out.output
    assert all(step == whole for step, whole in rows), rows
