"""Figures where features meet, and what a careful user types: each case a defect that printed
a wrong figure or an internal error, now a true figure or one line with a hint; and a list of
hostile inputs over the planner, the trace filters, checkpoints and fabrics, none of which
may reach an internal error or say something untrue. Pure logic and CliRunner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from iotune import cli as cli_mod
from iotune.errors import UsageError
from iotune.model.presets import get_preset
from iotune.plan import planner
from iotune.plan.datasheet import load_profiles, parse_drive
from iotune.units import parse_quantity
from tests.striping import preset_shares

DATA = Path(__file__).resolve().parent.parent / "data" / "study-h100"


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli_mod.cli, list(args), prog_name="iotune")


def _plan_json(*args: str) -> dict[str, Any]:
    r = _cli("--json", "estimate", *args)
    assert r.exit_code == 0, r.output
    plan: dict[str, Any] = json.loads(r.stdout)["drives"]
    return plan


# ------------------------------------------------------------------ defects, one by one


def test_a_link_bound_read_does_not_stop_more_drives_from_helping() -> None:
    """Reads bound by each drive's PCIe link, writes by the drives: both grow with K, so
    nothing caps the swaps from 1 drive on (the sentence said "more drives do not help"
    under a table whose bandwidth doubled up to 8 drives)."""
    spec = "read=7.0GB/s,write=5.1GB/s,link=8GT/s x4,capacity=2TB,tbw=1200TB"
    plan = _plan_json(
        "opt_nvme_16b", "--drive", spec, "--baseline", "study", "--target-step", "1.2x"
    )
    rows = plan["plans"]
    assert rows[0]["bound_by"] == "read: PCIe link, write: drives"
    answer = plan["target"]["answer"]
    assert "from 1 drives on" not in answer
    # the sentence's K is the first count whose bandwidth is no more than the one before
    k = int(answer.split("from ")[1].split(" drives on")[0])
    bws = {r["drives"]: r["read_bw_bytes_s"] for r in rows}
    # the table: it grows to 8 (8 members busy), each count at the stripe's share
    p16 = get_preset("opt_nvme_16b")
    assert bws[8] / preset_shares(p16, 8)[0] == pytest.approx(8 * bws[1], abs=8)
    assert bws[4] / preset_shares(p16, 4)[0] == pytest.approx(4 * bws[1], abs=4)
    # 8 drives had the stripe's share of their rate, 9 the 8 members' whole rate that the
    # requests in flight keep busy: from 10 on nothing grows
    assert bws[8] < 8 * bws[1]
    assert k == 10 and "RAID0 chunk caps the swaps" in answer


def test_ranks_on_a_node_swap_their_partitions_through_its_drives_and_step_their_share() -> None:
    """`estimate --ranks 8` against one rank, the same model on the same 4 and 16 drives
    (datasheet, the study's baseline). Each rank swaps its own eighth of the optimizer state
    through the node's drives and steps its own eighth on its own cores. The plan took one
    rank's eighth at the whole array's bandwidth (the swaps 8x too short), called the other
    seven eighths of the writes "updated parameters" (209.92 GiB; this preset keeps its
    parameters on the GPU) and read them again as parameter fetches, priced CPU Adam for
    all 16.10B parameters at one rank's threads, and capped the array at one rank's 8
    requests in flight."""
    spec = "samsung-pm9a3-3.84tb"
    one, eight = (
        _plan_json("opt_nvme_16b", "--drive", spec, "--baseline", "study", "--drives", "4,16",
                   *(("--ranks", str(r)) if r > 1 else ()))["plans"]
        for r in (1, 8)
    )  # fmt: skip
    for a, b in zip(one, eight, strict=True):
        ta = {t["kind"]: t for t in a["terms"]}
        tb = {t["kind"]: t for t in b["terms"]}
        # the node's swaps are the same bytes either way; at 4 drives the same seconds, but
        # for one rank's single stream of files, which has the stripe's share of the drives
        # (eight ranks' files in flight keep every member busy)
        shares = dict(
            zip(("read", "write"), preset_shares(get_preset("opt_nvme_16b"), 4), strict=True)
        )
        for kind in ("read", "write"):
            assert tb[kind]["what"].split(" at ")[0] == ta[kind]["what"].split(" at ")[0]
            if a["drives"] == 4:
                want = ta[kind]["seconds"] * shares[kind]
                assert tb[kind]["seconds"] == pytest.approx(want, abs=1e-3)
        assert "parameters" not in tb
        # CPU Adam: each rank an eighth of the parameters at the measured rate, side by side
        assert tb["adam"]["seconds"] == pytest.approx(ta["adam"]["seconds"] / 8, abs=1e-3)
        assert "each of 8 ranks' 2.01B parameters at 6 thread(s)" in tb["adam"]["what"]
        if a["drives"] == 4:
            faster = sum(ta[x]["seconds"] - tb[x]["seconds"] for x in ("read", "write"))
            assert b["step_s"] == pytest.approx(
                a["step_s"] - ta["adam"]["seconds"] * 7 / 8 - faster, abs=3e-3
            )
    # 8 requests of 512 KiB in flight per rank: one rank keeps 8 members of a 512 KiB chunk
    # busy, eight ranks 64, so 16 drives are the drives' bound, not the chunk's
    assert one[1]["bound_by"] == "RAID0 chunk" and eight[1]["bound_by"] == "drives"
    assert eight[1]["read_bw_bytes_s"] == 4 * eight[0]["read_bw_bytes_s"]


def test_the_arrays_requests_in_flight_are_every_ranks() -> None:
    from iotune.plan.drives import Raid

    one = Raid(512 << 10, 1 << 20, 8, 2, "mdadm's default chunk")
    assert one.busy == 32
    eight = Raid(512 << 10, 1 << 20, 8, 2, "mdadm's default chunk", 8)
    assert eight.busy == 256
    assert eight.describe() == (
        "RAID0 chunk 512 KiB against 8 ranks x 8 x 2 request(s) of 1 MiB in flight: at most "
        "256 members busy (mdadm's default chunk)"
    )
    assert one.describe().startswith("RAID0 chunk 512 KiB against 8 x 2 request(s)")
    two = Raid(512 << 10, 1 << 20, 8, 2, "mdadm's default chunk", 2)
    assert two.describe().startswith("RAID0 chunk 512 KiB against 2 ranks x 8 x 2 request(s)")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("read=7iB/s,write=5GB/s", "'i' belongs to a prefix"),
        ("read=7GB/s,write=5GB/s,link=16GT/s x0", "is not a PCIe link"),
    ],
)
def test_drive_specs_that_raised_internal_errors_are_one_line(spec: str, message: str) -> None:
    r = _cli("estimate", "opt_nvme_1b", "--drive", spec, "--drives", "1,2")
    assert r.exit_code == 2 and message in r.stderr and "internal error" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2, r.stderr


def test_bits_are_not_bytes_and_bytes_not_bits() -> None:
    # 56 Gb/s is 7 GB/s, not 56
    d = parse_drive("read=56Gbps,write=5GB/s")
    assert d.read == 7e9
    assert parse_drive("read=56Gb/s,write=5GB/s").read == parse_drive("read=7GB/s,write=5GB/s").read
    # a network link of 100 GB/s is 100 GB/s, not 12.5
    assert planner.parse_network("100GB/s") == 100e9
    assert planner.parse_network("100G") == planner.parse_network("100Gb/s") == 12.5e9
    plan = _plan_json(
        "opt_nvme_1b",
        "--drive",
        "read=56Gbps,write=5GB/s",
        "--drives",
        "1",
        "--network-link",
        "100GB/s",
    )
    (net,) = [x for x in plan["limits"] if x["what"].startswith("network link")]
    assert net["value"] == 100e9
    one = next(x for x in plan["limits"] if x["what"].startswith("one drive, read"))
    _, derate = load_profiles()
    assert one["value"] == pytest.approx(7e9 * derate.read)


def test_a_state_that_does_not_fit_is_said_and_never_the_answer() -> None:
    spec = "read=7.0GB/s,write=5.1GB/s,capacity=100GB"
    plan = _plan_json(
        "opt_nvme_16b",
        "--drive",
        spec,
        "--baseline",
        "study",
        "--drives",
        "1,2,3",
        "--target-step",
        "400",
    )
    fits = {p["drives"]: p["fits"] for p in plan["plans"]}
    need = plan["nvme_bytes"]
    assert fits == {k: k * 100e9 >= need for k in (1, 2, 3)} == {1: False, 2: False, 3: True}
    # every count meets 400 s, but the fewest that holds the state is 3
    assert plan["target"]["drives"] == 3 and "fewer drives do not hold" in plan["target"]["answer"]
    r = _cli(
        "estimate", "opt_nvme_16b", "--drive", spec, "--baseline", "study", "--drives", "1,2,3"
    )
    assert "does not fit: 1, 2 drive(s) of 100 GB (93.1 GiB) each" in r.stdout


def test_drives_are_not_planned_for_a_run_that_keeps_its_state_in_ram() -> None:
    r = _cli("estimate", "opt_ram_1b", "--drive", "samsung-980-pro-2tb", "--drives", "1,2")
    assert r.exit_code == 2 and "keeps its optimizer state and parameters off NVMe" in r.stderr
    assert "BOUND BY" not in r.stdout


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("read=7GB/s,write=5GB/s,read=6GB/s", "gives read= twice"),
        ("read=7GB/s,write=5GB/s,link=16GT/s x99", "is not a PCIe link"),
        ("read=7GB/s,write=5GB/s,cache=100GB", "cache= needs after_cache="),
        ("read=7GB/s,write=5GB/s,after_cache=1GB/s", "after_cache= needs cache="),
        ("read=-7GB/s,write=5GB/s", "read must be positive"),
        ("read=1e400GB/s,write=5GB/s", "is not a finite figure"),
        ("read=7gb/s,write=5GB/s", "ambiguous: bits or bytes"),
        ("read=7GB,write=5GB/s", "is a size, not a rate"),
        ("read=7,write=5GB/s", "has no unit"),
        ("read=7GB/s,write=5GB/s,capacity=2TB/s", "is a rate, not a size"),
    ],
)
def test_nonsense_in_a_drive_spec_is_refused_for_what_it_is(spec: str, message: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_drive(spec)
    assert message in e.value.message and e.value.hint


def test_a_smaller_capacity_of_a_profile_scales_its_rated_writes() -> None:
    """The 980 PRO's 1 TB is rated 600 TBW, half the 2 TB's 1,200: a profile's endurance
    goes with its capacity, and the source says so."""
    d = parse_drive("samsung-980-pro-2tb,capacity=1TB")
    assert d.capacity == 1e12 and d.tbw == 600e12 and d.rated_writes == 600e12
    assert "scaled" in d.source
    # the user's own TBW wins
    assert parse_drive("samsung-980-pro-2tb,capacity=1TB,tbw=700TB").tbw == 700e12


def test_tbw_alone_gives_days_to_tbw() -> None:
    plan = _plan_json(
        "opt_nvme_16b",
        "--drive",
        "read=7GB/s,write=5GB/s,tbw=600TB",
        "--baseline",
        "study",
        "--drives",
        "1,2",
    )
    for p in plan["plans"]:
        en = p["endurance"]
        assert en["dwpd"] is None  # a fraction of a capacity not given
        per_day = en["write_bytes_per_drive_day"]
        assert en["days_to_rated_writes"] == pytest.approx(600e12 / per_day, abs=0.05)  # 0.1 d


def test_a_swept_array_is_its_drives_not_one_drive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep of a RAID0 of 3 measured all three at once: the plan's one drive is a third
    of it (it was planned as one drive as fast as the array)."""
    args = ("opt_nvme_1b", "--aio-config", str(DATA / "sweep-aio"), "--drives", "1,3")
    alone = _plan_json(*args)
    monkeypatch.setattr(
        planner, "_swept_disks", lambda aio, host: ["nvme0n1", "nvme1n1", "nvme2n1"]
    )
    monkeypatch.setattr(planner, "swept_link", lambda aio, host: None)
    monkeypatch.setattr(planner, "swept_network", lambda aio, host: None)
    monkeypatch.setattr(planner, "_health", lambda disks, host: None)
    array = _plan_json(*args)
    one_alone = {p["drives"]: p for p in alone["plans"]}
    one_array = {p["drives"]: p for p in array["plans"]}
    # the sweep's plain files had the members' whole rate; the run's files get the stripe's
    # share of three drives
    rs, ws = preset_shares(get_preset("opt_nvme_1b"), 3)
    assert one_array[3]["read_bw_bytes_s"] == pytest.approx(
        one_alone[1]["read_bw_bytes_s"] * rs, abs=2
    )
    assert one_array[3]["write_bw_bytes_s"] == pytest.approx(
        one_alone[1]["write_bw_bytes_s"] * ws, abs=2
    )
    src = next(x for x in array["limits"] if x["what"].startswith("one drive, read"))["source"]
    assert "one of its 3 drives" in src


# ------------------------------------------------------------------ hostile inputs

#: a plan of two drives of the study's drive class, which each case below adds one option to
PLAN2 = ("estimate", "opt_nvme_1b", "--drive", "samsung-980-pro-2tb", "--drives", "2")

#: (arguments, what the one line must say); each exits 1 or 2 with a hint, never an internal
#: error, never a traceback
HOSTILE: list[tuple[tuple[str, ...], str]] = [
    # the planner and its drive specs
    (
        ("estimate", "opt_nvme_1b", "--drive", "read=7GB/s", "--drives", "1"),
        "needs a sequential write rate",
    ),
    (
        ("estimate", "opt_nvme_1b", "--drive", "read=7GB/s,write=5GB/s,warranty_years=50"),
        "is not a warranty",
    ),
    (
        ("estimate", "opt_nvme_1b", "--drive", "read=7GB/s,write=5GB/s,dram=maybe"),
        "is not true or false",
    ),
    (
        ("estimate", "opt_nvme_1b", "--drive", "read=7GB/s,write=5GB/s,capacity=-2TB"),
        "capacity must be positive",
    ),
    (("estimate", "opt_nvme_1b", "--drive", "read=nanGB/s,write=5GB/s"), "is not a rate"),
    (("estimate", "opt_nvme_1b", "--drive", ",,,"), "--drive is empty"),
    (
        ("estimate", "opt_nvme_1b", "--drive", "read=7GB/s,write=5GB/s,dwpd=1"),
        "without the drive's capacity",
    ),
    (
        (
            "estimate",
            "opt_nvme_1b",
            "--drive",
            "read=7GB/s,write=5GB/s,capacity=1TB,cache=2TB,after_cache=1GB/s",
        ),
        "cache is larger than the drive",
    ),
    (
        ("estimate", "opt_nvme_1b", "--drive", "read=7GB/s,write=5GB/s,speed=9"),
        "has no key 'speed'",
    ),
    (
        ("estimate", "opt_nvme_1b", "--drive", "samsung-980-pro-2tb", "--drives", "1,1e3"),
        "is not a list of drive counts",
    ),
    (
        ("estimate", "opt_nvme_1b", "--drive", "samsung-980-pro-2tb", "--drives", "-1"),
        "is not a list of drive counts",
    ),
    (
        ("estimate", "opt_nvme_1b", "--drive", "samsung-980-pro-2tb", "--target-step", "inf"),
        "--target-step must be positive",
    ),
    (
        ("estimate", "opt_nvme_1b", "--drive", "samsung-980-pro-2tb", "--target-step", "0.5x"),
        "at least 1x",
    ),
    (
        ("estimate", "opt_nvme_1b", "--drive", "samsung-980-pro-2tb", "--target-step", "fast"),
        "is neither seconds nor a multiple",
    ),
    (
        (
            *PLAN2,
            "--network-link",
            "100MB",
        ),
        "is a size, not a rate",
    ),
    (
        (
            *PLAN2,
            "--network-link",
            "-1G",
        ),
        "must be positive",
    ),
    (
        (
            *PLAN2,
            "--chunk",
            "512KB",
        ),
        "is ambiguous",
    ),
    (
        (
            *PLAN2,
            "--chunk",
            "0",
        ),
        "must be positive",
    ),
    (
        (
            *PLAN2,
            "--memory-bw",
            "-5",
        ),
        "--memory-bw must be the host's memory bandwidth",
    ),
    (
        (
            *PLAN2,
            "--link",
            "16GT/s x3",
        ),
        "--link '16GT/s x3' is not a PCIe link",
    ),
    (
        (
            *PLAN2,
            "--link",
            "7GT/s x4",
        ),
        "is not a PCIe link",
    ),
    (("estimate", "opt_ram_1b", "--drive", "samsung-980-pro-2tb", "--drives", "2"), "off NVMe"),
    (("estimate", "opt_nvme_1b", "--network-link", "100G"), "--network-link bounds a drives plan"),
    (("estimate", "opt_nvme_1b", "--set", "ds.aio.queue_depth=-1"), "must be a positive integer"),
    (("estimate", "opt_nvme_1b", "--set", "seq_len=abc"), "must be a positive integer"),
    (("estimate", "opt_nvme_1b", "--set", "nosuchkey=1"), "unknown setting"),
    # checkpoints
    (
        ("estimate", "opt_nvme_1b", "--checkpoint-every", "10", "--checkpoint-drive", "nosuch"),
        "--checkpoint-drive 'nosuch' is no drive profile",
    ),
    (
        ("estimate", "opt_nvme_1b", "--checkpoint-every", "10", "--checkpoint-share", "200%"),
        "is not a share of the training's time",
    ),
    (("estimate", "opt_nvme_1b", "--checkpoint-sweep", "x"), "--checkpoint-every says how often"),
    (
        ("run", "tiny_opt_nvme", "--checkpoint-every", "1", "--checkpoint-dir", "/proc"),
        "holds no files a checkpoint could be written to",
    ),
    (
        ("run", "tiny_opt_nvme", "--checkpoint-every", "1", "--checkpoint-writer", "nosuch"),
        "is not one of",
    ),
    (("sweep-checkpoint", "--target", "/nonexistent"), "does not exist"),
    # trace filters and sizes
    (("trace", "--duration", "-1"), "--duration must be positive"),
    (("trace", "--focus-size", "512KB", "--duration", "1"), "is ambiguous"),
    (("trace", "--focus-size", "0", "--duration", "1"), "must be positive"),
    (("trace", "--pid", "999999999", "--duration", "1"), "--pid 999999999"),
    (
        ("trace", "--cgroup", "/nonexistent/iotune-none", "--duration", "1"),
        "--cgroup /nonexistent/iotune-none",
    ),
    # fabrics
    (("fabrics", "connect", "tcp://"), "is not a fabrics target"),
    (("fabrics", "connect", "tcp://10.0.0.1:99999"), "is not a port"),
    (("fabrics", "connect", "xyz://1.2.3.4"), "unknown transport 'xyz'"),
    # sizes a sweep takes
    (("sweep-aio", "--target", "/tmp", "--block-size", "1.5M"), "is not a whole number"),
    (("sweep-aio", "--target", "/tmp", "--io-size", "16MB"), "is ambiguous"),
]


@pytest.mark.parametrize(
    ("args", "says"), HOSTILE, ids=[" ".join(a[:1] + a[-2:]) for a, _ in HOSTILE]
)
def test_hostile_inputs_get_one_true_line_and_a_hint(args: tuple[str, ...], says: str) -> None:
    r = _cli(*args)
    err = r.stderr
    assert r.exit_code in (1, 2), (r.exit_code, r.output)
    assert "internal error" not in err and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("iotune: error: ") and says in lines[0], err
    assert len(lines) == 2 and lines[1].startswith("hint: "), err


def test_the_hostile_list_is_forty_or_more() -> None:
    assert len(HOSTILE) >= 40


@pytest.mark.parametrize(
    ("text", "rate", "value"),
    [
        ("7.0GB/s", True, 7e9),
        ("56Gbps", True, 7e9),
        ("25GbE", True, 25e9 / 8),
        ("2MiB/s", True, 2 * 2**20),
        ("1.5TiB", False, 1.5 * 2**40),
        ("2TB", False, 2e12),
        ("341 GB", False, 341e9),
        ("56kbps", True, 7000.0),
    ],
)
def test_the_documented_forms(text: str, rate: bool, value: float) -> None:
    assert parse_quantity(text, what="--x", rate=rate) == pytest.approx(value)


#: (parser, text, options) -> the whole message and hint a user reads
MESSAGES = [
    (
        "q",
        "7iB/s",
        {"rate": True},
        "--x '7iB/s' is not a rate: 'i' belongs to a prefix (KiB, MiB, GiB)",
        "e.g. 7.0GB/s or 2MiB/s",
    ),
    ("q", "-5GB/s", {"rate": True}, "--x must be positive, got '-5GB/s'", "e.g. 7.0GB/s or 2MiB/s"),
    (
        "q",
        "1e400GB/s",
        {"rate": True},
        "--x '1e400GB/s' is not a finite figure",
        "e.g. 7.0GB/s or 2MiB/s",
    ),
    (
        "q",
        "fast",
        {"rate": True},
        "--x 'fast' is not a rate",
        "write it with its unit, e.g. 7.0GB/s or 2MiB/s",
    ),
    (
        "q",
        "fast",
        {"rate": False},
        "--x 'fast' is not a size",
        "write it with its unit, e.g. 2TB or 1.5TiB",
    ),
    (
        "q",
        "7GB",
        {"rate": True},
        "--x '7GB' is a size, not a rate",
        "add /s, e.g. 7.0GB/s or 2MiB/s",
    ),
    ("q", "7GB/s", {"rate": False}, "--x '7GB/s' is a rate, not a size", "e.g. 2TB or 1.5TiB"),
    (
        "q",
        "7",
        {"rate": True},
        "--x '7' has no unit: bytes (B) or bits (b)?",
        "write it with its unit, e.g. 7.0GB/s or 2MiB/s",
    ),
    (
        "q",
        "7G/s",
        {"rate": True, "bare": "binary"},
        "--x '7G/s' has no unit: bytes (B) or bits (b)?",
        "write it with its unit, e.g. 7.0GB/s or 2MiB/s",
    ),
    ("q", "7Gi", {"rate": False, "bare": "binary"}, "--x '7Gi' has no unit", "e.g. 2TB or 1.5TiB"),
    (
        "q",
        "5gb/s",
        {"rate": True},
        "--x '5gb/s' is ambiguous: bits or bytes?",
        "write GB for bytes or Gb for bits, e.g. 7.0GB/s or 2MiB/s",
    ),
    (
        "q",
        "5tb/s",
        {"rate": True},
        "--x '5tb/s' is ambiguous: bits or bytes?",
        "write TB for bytes or Tb for bits, e.g. 7.0GB/s or 2MiB/s",
    ),
    (
        "q",
        "5eb/s",
        {"rate": True},
        "--x '5eb/s' is ambiguous: bits or bytes?",
        "write EB for bytes or Eb for bits, e.g. 7.0GB/s or 2MiB/s",
    ),
    (
        "q",
        "5mB/s",
        {"rate": True},
        "--x '5mB/s' is ambiguous: a small m is milli",
        "write MB or MiB, e.g. 7.0GB/s or 2MiB/s",
    ),
    (
        "q",
        "7x",
        {"rate": True, "example": "read=7.0GB/s"},
        "--x '7x' is not a rate",
        "write it with its unit, e.g. read=7.0GB/s",
    ),
    (
        "s",
        "512KB",
        {},
        "--x '512KB' is ambiguous: KB is 10^3 bytes on a datasheet and 2^10 in fio",
        "write 512K or 512KiB (binary)",
    ),
    (
        "s",
        "+64MB",
        {},
        "--x '+64MB' is ambiguous: MB is 10^6 bytes on a datasheet and 2^20 in fio",
        "write 64M or 64MiB (binary)",
    ),
    (
        "s",
        "2gB",
        {},
        "--x '2gB' is ambiguous: GB is 10^9 bytes on a datasheet and 2^30 in fio",
        "write 2G or 2GiB (binary)",
    ),
    ("s", "1.5M", {}, "--x '1.5M' is not a whole number of bytes or units", "e.g. 512K, 1M"),
    (
        "s",
        "12Q",
        {},
        "--x '12Q' is not a size",
        "write it as bytes or with K, M, G (binary): 512K, 1M",
    ),
    ("s", "0", {}, "--x must be positive, got '0'", "e.g. 512K"),
]


@pytest.mark.parametrize(("parser", "text", "opts", "message", "hint"), MESSAGES)
def test_each_refusal_says_exactly_what_is_wrong(
    parser: str, text: str, opts: dict[str, Any], message: str, hint: str
) -> None:
    from iotune.units import parse_size

    with pytest.raises(UsageError) as e:
        if parser == "q":
            parse_quantity(text, what="--x", **opts)
        else:
            parse_size(text, what="--x")
    assert (e.value.message, e.value.hint) == (message, hint)


def test_a_keys_name_is_joined_to_its_value() -> None:
    with pytest.raises(UsageError) as e:
        parse_quantity("7x", what="--drive read=", rate=True)
    assert e.value.message == "--drive read='7x' is not a rate"
    with pytest.raises(UsageError) as e:
        parse_quantity("-7GB/s", what="--drive read=", rate=True)
    assert e.value.message == "--drive read must be positive, got '-7GB/s'"


@pytest.mark.parametrize(
    ("text", "bare", "value"),
    [
        ("100Gb", "bits", 12.5e9),  # a link's bits, per second by trade
        ("100 Gbit", "bits", 12.5e9),
        ("100 Gbits", "bits", 12.5e9),
        ("25GbE", "refuse", 25e9 / 8),
        ("7 bytes/s", "refuse", 7.0),
        ("7 byte/s", "refuse", 7.0),
        ("8 bit/s", "refuse", 1.0),
        ("1 Pb/s", "refuse", 1e15 / 8),
        ("1 Eb/s", "refuse", 1e18 / 8),
        ("1 PiB/s", "refuse", 2.0**50),
        ("1 kB/s", "refuse", 1e3),
        ("1.5e3MB/s", "refuse", 1.5e9),
        (".5GB/s", "refuse", 0.5e9),
        ("2GB/sec", "refuse", 2e9),
    ],
)
def test_rates_in_every_form_users_write(text: str, bare: Any, value: float) -> None:
    assert parse_quantity(text, what="--x", rate=True, bare=bare) == pytest.approx(value)


def test_a_bare_figure_is_binary_only_for_a_block_size() -> None:
    assert parse_quantity("512K", what="--x", rate=False, bare="binary") == 512 * 1024
    assert parse_quantity("3", what="--x", rate=False, bare="binary") == 3
    assert parse_quantity("1m", what="--x", rate=False, bare="binary") == 2**20
    with pytest.raises(UsageError, match="no unit"):
        parse_quantity("512K", what="--x", rate=False)
    with pytest.raises(UsageError, match="a size, not a rate"):
        parse_quantity("100GB", what="--x", rate=True, bare="bits")


@pytest.mark.parametrize(
    ("n", "short", "spelled"),
    [
        (1, "1", "1 B"),
        (1023, "1023", "1023 B"),
        (1024, "1K", "1 KiB"),
        (1536, "1536", "1536 B"),
        (3 * 1024, "3K", "3 KiB"),
        (524288, "512K", "512 KiB"),
        (1023 * 1024, "1023K", "1023 KiB"),
        (2**20, "1M", "1 MiB"),
        (3 * 2**20, "3M", "3 MiB"),
        (2**20 + 1024, "1025K", "1025 KiB"),
        (2**30, "1G", "1 GiB"),
        (5 * 2**30, "5G", "5 GiB"),
        (2**30 + 2**20, "1025M", "1025 MiB"),
    ],
)
def test_block_sizes_print_exactly(n: int, short: str, spelled: str) -> None:
    from iotune.units import binary_size, format_size, parse_size

    assert format_size(n) == short and binary_size(n) == spelled
    assert parse_size(short) == n


@pytest.mark.parametrize(
    ("n", "per", "text"),
    [
        (0.0, "", "0.0 KiB"),
        (1023.0, "", "1.0 KiB"),
        (2**20 - 1, "/s", "1024.0 KiB/s"),
        (2**20, "", "1.0 MiB"),
        (25 * 2**20, "/s", "25.0 MiB/s"),
        (2**30 - 1, "", "1024.0 MiB"),
        (2**30, "", "1.00 GiB"),
        (1.5 * 2**30, "/s", "1.50 GiB/s"),
    ],
)
def test_amounts_print_in_the_unit_that_fits(n: float, per: str, text: str) -> None:
    from iotune.units import amount, gib_text, gib_value, scale_for

    assert amount(n, per) == text
    unit = text.split()[1].removesuffix("/s")
    assert scale_for(n) == (unit, {"KiB": 1024.0, "MiB": 2.0**20, "GiB": 2.0**30}[unit])
    assert gib_text(None) == "-" and gib_value(None) is None
    assert gib_text(1.25 * 2**30) == "1.2" and gib_text(1.25 * 2**30, 2) == "1.25"
    assert gib_value(2**30 / 3) == 0.3333


def test_the_vm_tier_names_a_checkout_its_guest_cannot_see(tmp_path: Path) -> None:
    """virtme-ng's guest mounts a fresh /var/tmp (and /run, /var/cache, ...): a checkout
    there is an empty folder in the guest, and every vm test failed with 'python: not
    found'. The tier refuses in one line that names the path and the way around it."""
    from tests.vm.guest import hidden_from_guest

    line = hidden_from_guest(Path("/var/tmp/ci/iotune"), Path("/var/tmp/ci/iotune/.venv/bin"))
    assert line is not None and "\n" not in line
    assert line.startswith(
        "the vm tier cannot run from /var/tmp/ci/iotune: its guest mounts a fresh /var/tmp"
    )
    assert "clone the repository elsewhere" in line
    assert hidden_from_guest(Path("/tmp/ci/iotune"), Path("/srv/x/.venv/bin")) is None
    assert hidden_from_guest(Path("/home/u/iotune"), Path("/var/cache/v/bin")) is not None
    # a link into a hidden folder is followed
    link = tmp_path / "link"
    link.symlink_to("/run")
    assert hidden_from_guest(link) is not None
    assert hidden_from_guest(Path("/var/tmpx/iotune")) is None
