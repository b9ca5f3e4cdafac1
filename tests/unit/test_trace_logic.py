import re
from pathlib import Path

import pytest

from iotune.errors import DeviceNotFound, IotuneError, NotRootError, UsageError
from iotune.probes.sysfs import SysTree
from iotune.trace import model
from iotune.trace.backend import BackendChoice, choose_backend
from iotune.trace.diskstats import parse_stat
from iotune.trace.targets import (
    Array,
    Targets,
    expand,
    kernel_dev,
    merged,
    nvme_drives,
    resolve_devices,
    select,
)
from iotune.units import format_size, parse_size

DATA = Path(__file__).resolve().parent.parent / "data"
K = 1024


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("512K", 524288),
        ("512k", 524288),
        ("1M", 2**20),
        ("4KiB", 4096),
        ("524288", 524288),
        ("2g", 2**31),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-4K", "0", "1.5M", "12Q"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_size(text)


def test_format_size_is_exact() -> None:
    assert [format_size(n) for n in (524288, 2**20, 1536, 4096, 1023 * K)] == [
        "512K",
        "1M",
        "1536",
        "4K",
        "1023K",
    ]


def test_parse_stat_line_from_a_real_disk() -> None:
    # /sys/block/vda/stat of the CI host (17 fields)
    line = "   13468     1204  1433178    10716   297466   325745 13011098   581044        0   263816   603752        0        0        0        0    33164    11991"
    s = parse_stat(line)
    assert (s.read_ios, s.read_sectors, s.write_ios, s.write_sectors) == (
        13468,
        1433178,
        297466,
        13011098,
    )
    assert s.flush_ios == 33164 and s.read_bytes == 1433178 * 512
    old = parse_stat("1 0 8 0 2 0 16 0 0 0 0")  # pre-4.18 kernels: 11 fields
    assert (old.write_ios, old.discard_ios, old.flush_ios) == (2, 0, 0)


def test_exact_sizes_split_focus_from_other_and_keep_1023k_apart() -> None:
    dev = kernel_dev(259, 0)
    counts = {
        (dev, 1, 512 * K): 23,
        (dev, 1, 1023 * K): 2,
        (dev, 1, 4 * K): 5,
        (dev, 0, 512 * K): 7,
        (kernel_dev(259, 1), 1, 512 * K): 100,
    }
    w = model.op_stats(counts, dev, 1, 512 * K)
    assert (w.requests, w.focus_requests, w.other_requests) == (30, 23, 7)
    assert w.bytes == 23 * 512 * K + 2 * 1023 * K + 5 * 4 * K
    assert w.sizes == {4 * K: 5, 512 * K: 23, 1023 * K: 2}
    # a log2 histogram puts 512K and 1023K in one slot; the exact counts do not
    assert model.slot_range(20) == (512 * K, 1024 * K - 1)
    r = model.op_stats(counts, dev, 0, 512 * K)
    assert (r.requests, r.focus_requests) == (7, 7)


def test_merge_sums_members_and_keeps_unknown_unknown() -> None:
    a = model.OpStats(10, 2, 1, 1, {4: 1, 6: 1})
    b = model.OpStats(8, 2, 2, 0, {4: 2})
    m = model.merge([a, b])
    assert (m.bytes, m.requests, m.focus_requests, m.other_requests, m.sizes) == (
        18,
        4,
        3,
        1,
        {4: 3, 6: 1},
    )
    assert model.merge([a, model.OpStats(1, 1, None, None)]).focus_requests is None


def test_sub_drops_unchanged_keys() -> None:
    assert model.sub({(1, 0, 4): 5, (1, 1, 4): 3}, {(1, 0, 4): 5, (1, 1, 4): 1}) == {(1, 1, 4): 2}


def test_check_against_diskstats() -> None:
    w = model.OpStats(23 * 512 * K, 23, 23, 0)
    r = model.OpStats(0, 0, 0, 0)
    ok = model.check(r, w, parse_stat(f"0 0 0 0 23 0 {23 * 1024} 0 0 0 0"))
    assert ok.exact and ok.describe().startswith("exact: ")
    off = model.check(r, w, parse_stat(f"0 0 0 0 24 0 {24 * 1024} 0 0 0 0"))
    assert not off.exact and "write ios 23/24 (-1)" in off.describe()
    assert off.describe().startswith("differs: ")


def test_check_reconciles_requests_in_flight_at_either_end() -> None:
    # 11 reads issued in the trace; 3 more (24 sectors) were in flight when it started and
    # completed during it: the kernel counts 14, and so do the traced completions
    r = model.OpStats(11 * 4 * K, 11, 0, 11)
    w = model.OpStats(0, 0, 0, 0)
    kernel = parse_stat("14 0 112 0 0 0 0 0 0 0 0")
    chk = model.check(r, w, kernel, {0: (14, 112)}, inflight_start=(3, 0))
    assert chk.exact, chk.describe()
    assert "3 read(s) in flight when tracing started" in chk.describe()
    # the same figures without the in-flight count do not add up: named, not hidden
    bad = model.check(r, w, kernel, {0: (14, 112)})
    assert not bad.exact and "do not add up" in bad.describe()
    # a request issued in the trace and still in flight at its end: issued 12, kernel 11
    r12 = model.OpStats(12 * 4 * K, 12, 0, 12)
    end = model.check(
        r12, w, parse_stat("11 0 88 0 0 0 0 0 0 0 0"), {0: (11, 88)}, inflight_end=(1, 0)
    )
    assert end.exact and "still in flight at its end" in end.describe()
    # completions that differ from the kernel's counts are never exact
    lost = model.check(r, w, kernel, {0: (13, 104)}, inflight_start=(2, 0))
    assert not lost.exact and "read ios 13/14 (-1)" in lost.describe()


def test_check_counts_empty_preflush_writes_the_kernel_completes() -> None:
    # blk-mq issues only the flush request of an empty pre-flush write, but completes and
    # accounts the write itself: 23 data writes issued, 24 write ios in diskstats
    w = model.OpStats(23 * 512 * K, 23, 23, 0)
    r = model.OpStats(0, 0, 0, 0)
    kernel = parse_stat(f"0 0 0 0 24 0 {23 * 1024} 0 0 0 0")
    done = {1: (23, 23 * 1024), model.OP_EMPTY_PREFLUSH: (1, 0)}
    chk = model.check(r, w, kernel, done)
    assert chk.exact and chk.empty_preflush_writes == 1
    assert "1 empty pre-flush write(s)" in chk.describe()
    # an extra write io without a traced empty pre-flush completion is a difference
    assert not model.check(r, w, kernel, {1: (23, 23 * 1024)}).exact


def test_check_counts_a_flush_sequenced_write_once() -> None:
    # a journal commit block (data, PREFLUSH | FUA on a drive without FUA): issued once,
    # completed with its data (unaccounted), then ended again, empty, by the flush sequence
    # (accounted): 3 data writes issued and 3 write ios in diskstats, 4 completions traced
    w = model.OpStats(3 * 4 * K, 3, 0, 3)
    r = model.OpStats(0, 0, 0, 0)
    kernel = parse_stat("0 0 0 0 3 0 24 0 0 0 0")
    done = {1: (3, 24), model.OP_FLUSH_SEQ_DONE: (1, 0)}
    chk = model.check(r, w, kernel, done)
    assert chk.exact and chk.write.flush_seq_done == 1
    assert "1 write(s) with data went through the flush sequence" in chk.describe()
    # counted as an empty pre-flush instead, it would be one write io too many
    assert not model.check(r, w, kernel, {1: (3, 24), model.OP_EMPTY_PREFLUSH: (1, 0)}).exact


def test_md_array_expands_to_its_member_disks() -> None:
    tree = SysTree(DATA / "qemu-nvme")
    t = expand(tree, "md127")
    assert t.disks == ("nvme2n1",)
    assert t.stacked == ("md127",)
    assert [(a.name, a.level, a.members) for a in t.arrays] == [("md127", "raid1", ("nvme2n1",))]
    assert t.arrays[0].chunk_bytes is None  # RAID1 has no chunk


def test_named_devices_and_partitions_resolve_to_disks() -> None:
    tree = SysTree(DATA / "ci-host")
    t = resolve_devices(tree, ["loop0", "/dev/loop3p1", "loop0"])
    assert t.disks == ("loop0", "loop3")
    with pytest.raises(DeviceNotFound):
        resolve_devices(tree, ["nvme9n9"])


def test_targets_merge_keeps_each_drive_once_in_order() -> None:
    md = Array("md127", "raid0", 524288, ("nvme1n1", "nvme2n1"))
    a = Targets(disks=("nvme0n1", "nvme1n1"))
    b = Targets(disks=("nvme1n1", "nvme2n1"), arrays=(md,), stacked=("md127",))
    m = merged(a, b)
    assert m == Targets(("nvme0n1", "nvme1n1", "nvme2n1"), (md,), ("md127",))


def test_no_drive_named_means_every_nvme_drive() -> None:
    tree = SysTree(DATA / "qemu-nvme")
    every = ("nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1", "nvme4n1", "nvme5n1")
    assert nvme_drives(tree).disks == every
    assert select(tree, None, None).disks == every
    assert select(tree, "", None).disks == every
    t = select(tree, "nvme4n1,md127", None)
    assert t.disks == ("nvme4n1", "nvme2n1") and t.stacked == ("md127",)
    with pytest.raises(UsageError, match="no drives to trace: this host has no NVMe drives"):
        select(SysTree(DATA / "ci-host"), None, None)


NO_BTF = "no kernel BTF (/sys/kernel/btf/vmlinux)"


def test_auto_backend_is_libbpf_where_it_loads_else_bcc_and_says_why() -> None:
    tree = SysTree(DATA / "ci-host")  # tracefs with the recorded block_rq_issue format
    ok = choose_backend(
        "auto", tree, is_root=True, bcc_available=lambda: True, libbpf_unavailable=lambda: None
    )
    assert ok == BackendChoice("libbpf")
    c = choose_backend(
        "auto", tree, is_root=True, bcc_available=lambda: True, libbpf_unavailable=lambda: NO_BTF
    )
    assert c == BackendChoice("bcc", note=f"tracing with bcc: libbpf cannot ({NO_BTF})")


def test_auto_backend_falls_back_to_diskstats_and_says_why(tmp_path: Path) -> None:
    def auto(tree: SysTree, root: bool = True, bcc: bool = True) -> BackendChoice:
        return choose_backend(
            "auto",
            tree,
            is_root=root,
            bcc_available=lambda: bcc,
            libbpf_unavailable=lambda: NO_BTF,
        )

    c = auto(SysTree(DATA / "ci-host"), root=False, bcc=False)
    assert c.backend == "diskstats"
    assert c.warning is not None
    assert c.warning.startswith("using the diskstats backend (not root): ")
    assert c.warning.endswith("'iotune doctor --for trace' says what to fix")
    c = auto(SysTree(DATA / "ci-host"), bcc=False)
    assert c.warning is not None
    assert c.warning.startswith(
        f"using the diskstats backend (libbpf: {NO_BTF}, bcc not importable)"
    )
    bare = auto(SysTree(tmp_path))
    assert bare.backend == "diskstats" and bare.warning is not None
    assert "(libbpf: no kernel BTF (/sys/kernel/btf/vmlinux), tracefs not mounted)" in bare.warning
    fmt = "sys/kernel/tracing/events/block/block_rq_issue/format"
    (tmp_path / fmt).parent.mkdir(parents=True)
    (tmp_path / fmt).write_text("\tfield:dev_t dev;\toffset:8;\tsize:4;\tsigned:0;\n")
    old = auto(SysTree(tmp_path))
    assert old.warning is not None
    assert "block:block_rq_issue lacks field(s) bytes, nr_sector, rwbs, sector)" in old.warning


def test_a_named_backend_is_taken_or_refused(tmp_path: Path) -> None:
    tree = SysTree(DATA / "ci-host")
    assert choose_backend("bcc", tree, is_root=True).backend == "bcc"
    assert choose_backend("diskstats", SysTree(tmp_path), is_root=False).backend == "diskstats"
    with pytest.raises(NotRootError):
        choose_backend("bcc", tree, is_root=False)
    with pytest.raises(IotuneError, match="cannot trace with bcc: tracefs not mounted") as info:
        choose_backend("bcc", SysTree(tmp_path), is_root=True)
    assert info.value.hint == "mount tracefs first"
    lb = choose_backend("libbpf", tree, is_root=True, libbpf_unavailable=lambda: None)
    assert lb.backend == "libbpf"
    with pytest.raises(NotRootError):
        choose_backend("libbpf", tree, is_root=False, libbpf_unavailable=lambda: None)
    with pytest.raises(IotuneError, match=re.escape(f"cannot trace with libbpf: {NO_BTF}")) as info:
        choose_backend("libbpf", tree, is_root=True, libbpf_unavailable=lambda: NO_BTF)
    assert info.value.hint == "use --backend bcc"


def test_other_io_names_each_submitter_that_is_not_the_workload() -> None:
    from iotune.trace.outputs import other_io
    from iotune.trace.render import other_io_line

    vda, vdb = kernel_dev(254, 0), kernel_dev(254, 16)
    owners = {
        (vda, 1, 0): (10, 2048),  # the workload: 1 MiB written
        (vda, 1, 555): (2, 16),  # jbd2: 8 KiB written
        (vda, 0, 555): (1, 8),  # and 4 KiB read
        (vda, 3, 600): (1, 0),  # a flush names no bytes: left out
        (vdb, 1, 777): (5, 1024),  # a drive that is not traced: left out
    }
    got = other_io(owners, {555: "jbd2/vda1-8", 600: "kworker/0:1"}, {"vda": vda})
    assert got["workload_bytes"] == {"read": 0, "write": 2048 * 512}
    assert got["others"] == [
        {"pid": 555, "comm": "jbd2/vda1-8", "device": "vda", "read": 4096, "write": 8192}
    ]
    assert got["other_bytes"] == {"read": 4096, "write": 8192}
    line = other_io_line({"other_io": got})
    assert (
        line is not None
        and "4 KiB read, 8 KiB written by jbd2/vda1-8 (pid 555, vda) 12 KiB" in line
    )
    assert other_io_line({"other_io": {**got, "others": []}}) is None
    assert other_io_line({}) is None
    assert line.startswith(
        "other I/O on the traced drive(s), not the workload's but in the figures"
    )
    # under --cgroup (with a COMMAND) the figures are the cgroup's alone: the rest is not in them
    line = other_io_line({"other_io": got, "only": {"cgroup": "/sys/fs/cgroup/pod"}})
    assert line is not None and line.startswith(
        "other I/O on the traced drive(s), not cgroup /sys/fs/cgroup/pod's and not in the "
        "figures above: 4 KiB read, 8 KiB written by jbd2/vda1-8"
    ), line


def test_events_the_kernel_skipped_are_named_as_the_cause() -> None:
    # one 4 MiB read completion never reached the tracer; the kernel counted it
    r = model.OpStats(2776 * 4096, 2776, 0, 2776)
    w = model.OpStats(0, 0, 0, 0)
    kernel = parse_stat(f"2776 0 {2776 * 8} 0 0 0 0 0 0 0 0")
    done = {0: (2775, 2776 * 8 - 8192)}
    chk = model.check(r, w, kernel, done, missed=(0, 1))
    assert not chk.exact and chk.explained_by_misses
    assert chk.describe().startswith("consistent: ")
    assert "did not deliver up to 0 issue and 1 completion event(s)" in chk.describe()
    # more missing than the kernel skipped: not the misses; the issues still add up with the
    # kernel's count, so the two completions are ones no event reached
    short = model.check(r, w, kernel, {0: (2774, 2776 * 8 - 8192)}, missed=(0, 1))
    assert not short.explained_by_misses and short.explained_by_unseen
    # and with an issue missing as well: a real difference
    r2 = model.OpStats(2775 * 4096, 2775, 0, 2775)
    worse = model.check(r2, w, kernel, {0: (2774, 2776 * 8 - 8192)}, missed=(0, 1))
    assert not worse.explained_by_misses and worse.describe().startswith("differs: ")


def test_completions_no_event_saw_are_consistent_when_the_issues_add_up() -> None:
    # 14 reads issued and counted by the kernel; one completion fired no event (the kernel's
    # own block_io_done missed it too): the issues prove each request was seen and sized
    r = model.OpStats(14 * 4 * K, 14, 0, 14)
    w = model.OpStats(0, 0, 0, 0)
    kernel = parse_stat("14 0 112 0 0 0 0 0 0 0 0")
    chk = model.check(r, w, kernel, {0: (13, 104)})
    assert not chk.exact and chk.explained_by_unseen and chk.unseen_completions == 1
    text = chk.describe()
    assert text.startswith("consistent: ") and "read ios 13/14 (-1)" in text
    assert "1 read completion(s) the kernel counted reached no completion event" in text
    assert "do not add up" not in text
    # with requests in flight at either end the issues are reconciled with them
    r12 = model.OpStats(12 * 4 * K, 12, 0, 12)
    mid = model.check(r12, w, kernel, {0: (13, 104)}, inflight_start=(3, 0), inflight_end=(1, 0))
    assert mid.explained_by_unseen and mid.unseen_completions == 1
    # an issue too few: not explained (the sizes would be short)
    r13 = model.OpStats(13 * 4 * K, 13, 0, 13)
    short = model.check(r13, w, kernel, {0: (13, 104)})
    assert not short.explained_by_unseen and short.unseen_completions == 0
    assert short.describe().startswith("differs: ")
    # sizes that disagree with the kernel's sectors: not explained
    odd = model.check(model.OpStats(14 * 8 * K, 14, 0, 14), w, kernel, {0: (13, 104)})
    assert not odd.explained_by_unseen
    # more traced completions than the kernel counted: never explained this way
    extra = model.check(r, w, kernel, {0: (15, 120)})
    assert not extra.explained_by_unseen and extra.describe().startswith("differs: ")
    # counters read while I/O went on: approximate, not consistent
    busy = model.check(r, w, kernel, {0: (13, 104)}, settled=False)
    assert not busy.explained_by_unseen and busy.describe().startswith("approximate: ")


def test_missed_events_take_the_larger_of_the_kernels_and_the_tracers_count() -> None:
    # a 6.1 kernel counts no skips; the raw tracepoints saw two completions on a busy CPU
    assert model.missed_events({"nested:block_rq_complete": 2, "nested:block_rq_issue": 0}) == (
        0,
        2,
    )
    # a 6.7+ kernel also counts skips caused by another tool's programs
    got = model.missed_events(
        {
            "block:block_rq_issue": 1,
            "block:block_rq_requeue": 1,
            "block:block_rq_complete": 3,
            "nested:block_rq_issue": 1,
            "nested:block_rq_complete": 2,
        }
    )
    assert got == (2, 3)
    assert model.missed_events({}) == (0, 0)


def test_log2_histogram_is_derived_from_the_exact_counts() -> None:
    from iotune.trace.mapreader import log2_hist

    counts = {(7, 1, 512 * K): 3, (7, 1, 1023 * K): 2, (7, 1, 1024 * K): 1, (7, 3, 0): 4,
              (7, 0, 4 * K): 0}  # fmt: skip
    assert log2_hist(counts) == {(7, 1, 20): 5, (7, 1, 21): 1, (7, 3, 0): 4}
    # slot k holds [2^(k-1), 2^k - 1], as bcc's bpf_log2l numbers them
    assert model.slot_range(20) == (512 * K, 1024 * K - 1)


def test_the_kernels_own_miss_count_from_6_7() -> None:
    from iotune.trace.bpf import kernel_counts_misses

    assert kernel_counts_misses("6.18.44-fc-v657") and kernel_counts_misses("6.7.0")
    assert not kernel_counts_misses("6.1.0-28-amd64") and not kernel_counts_misses("5.15.0")


def _trace_cli(*args: str) -> tuple[int, list[str]]:
    from click.testing import CliRunner

    from iotune import cli

    result = CliRunner().invoke(cli.cli, ["trace", *args], prog_name="iotune")
    return result.exit_code, result.stderr.strip().splitlines()


def test_a_duration_and_a_command_are_refused_for_what_they_are() -> None:
    """Both end the trace (the command when it exits, --duration after S seconds): the
    error names the two given, not a missing one."""
    code, lines = _trace_cli("--devices", "loop0", "--duration", "2", "--", "true")
    assert code == 2 and len(lines) == 2, lines
    assert lines[0] == (
        "iotune: error: --duration 2 and a command both say when the trace ends: give one"
    )
    assert lines[1].startswith("hint: ") and "-- fio job.fio" in lines[1], lines
    # neither: there is something to say
    code, lines = _trace_cli("--devices", "loop0")
    assert code == 2 and lines[0].startswith("iotune: error: say what to trace"), lines
