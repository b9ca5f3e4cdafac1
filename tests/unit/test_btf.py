"""The BTF reader behind the tracer's BTF tracepoint programs, on a small BTF blob built
here (the kernel's own is read by the root tier)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from iotune.trace.btf import (
    KIND_ENUM,
    KIND_FUNC_PROTO,
    KIND_INT,
    KIND_PTR,
    KIND_STRUCT,
    KIND_TYPEDEF,
    KIND_UNION,
    Btf,
    BtfError,
)


class Blob:
    """Builds BTF data: types in order (ids from 1), names in a string section."""

    def __init__(self) -> None:
        self.types = b""
        self.strings = b"\0"

    def name(self, s: str) -> int:
        if not s:
            return 0
        off = len(self.strings)
        self.strings += s.encode() + b"\0"
        return off

    def add(
        self, kind: int, name: str, vlen: int, size: int, tail: bytes, flag: bool = False
    ) -> None:
        info = (kind << 24) | vlen | (1 << 31 if flag else 0)
        self.types += struct.pack("<III", self.name(name), info, size) + tail

    def members(self, *ms: tuple[str, int, int]) -> bytes:
        return b"".join(struct.pack("<III", self.name(n), t, off) for n, t, off in ms)

    def data(self) -> bytes:
        hdr = struct.pack(
            "<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(self.types), len(self.types), len(self.strings)
        )
        return hdr + self.types + self.strings


def sample() -> Btf:
    return Btf(sample_blob())


def sample_blob() -> bytes:
    b = Blob()
    b.add(KIND_INT, "u32", 0, 4, struct.pack("<I", 32))  # 1
    b.add(KIND_STRUCT, "iter", 2, 8, b.members(("bi_sector", 1, 0), ("bi_size", 1, 32)))  # 2
    b.add(KIND_UNION, "", 1, 4, b.members(("hidden", 1, 0)))  # 3: anonymous
    b.add(KIND_TYPEDEF, "iter_t", 0, 2, b"")  # 4: typedef of iter
    b.add(
        KIND_STRUCT,
        "outer",
        3,
        16,
        b.members(("first", 1, 0), ("", 3, 32), ("it", 4, 64)),
    )  # 5
    b.add(KIND_ENUM, "req_op", 2, 4, struct.pack("<IiIi", b.name("A"), 0, b.name("Z"), 9))  # 6
    b.add(KIND_TYPEDEF, "btf_trace_ev", 0, 1, b"")  # 7
    # a bitfield: kind_flag set, offset = size << 24 | bit offset
    b.add(KIND_STRUCT, "bits", 1, 4, b.members(("bf", 1, (3 << 24) | 5)), flag=True)  # 8
    # a tracepoint's typedef: btf_trace_tp -> pointer -> void (void *, struct outer *, u32)
    b.add(KIND_PTR, "", 0, 0, b"")  # 9: void *
    b.add(KIND_PTR, "", 0, 5, b"")  # 10: struct outer *
    proto = struct.pack("<IIII", 0, 9, 0, 10) + struct.pack("<II", 0, 1)
    b.add(KIND_FUNC_PROTO, "", 3, 0, proto)  # 11
    b.add(KIND_PTR, "", 0, 11, b"")  # 12
    b.add(KIND_TYPEDEF, "btf_trace_tp", 0, 12, b"")  # 13
    return b.data()


def test_member_offsets_through_anonymous_unions_and_typedefs() -> None:
    btf = sample()
    assert btf.offset("outer", "first") == 0
    assert btf.offset("outer", "hidden") == 4  # inside the anonymous union at byte 4
    assert btf.offset("outer", "it.bi_size") == 12  # through the typedef to struct iter
    assert btf.offset("iter", "bi_size") == 4


def test_enums_and_lookups_by_kind_and_name() -> None:
    btf = sample()
    assert btf.enum("req_op") == {"A": 0, "Z": 9}
    assert btf.find(KIND_TYPEDEF, "btf_trace_ev") == 7
    assert btf.find(KIND_STRUCT, "outer") == 5
    with pytest.raises(BtfError, match="no btf_trace_other"):
        btf.find(KIND_TYPEDEF, "btf_trace_other")


def test_a_tracepoints_arguments_from_its_typedef() -> None:
    btf = sample()
    assert btf.tracepoint_args(btf.find(KIND_TYPEDEF, "btf_trace_tp")) == (
        "struct outer *",
        "u32",
    )
    with pytest.raises(BtfError, match="not a btf_trace_"):
        btf.tracepoint_args(btf.find(KIND_TYPEDEF, "iter_t"))


def test_a_kind_newer_than_the_reader_is_refused() -> None:
    b = Blob()
    b.add(20, "future", 0, 0, b"")
    with pytest.raises(BtfError, match="kind 20"):
        Btf(b.data())


def test_what_is_not_there_is_an_error() -> None:
    btf = sample()
    with pytest.raises(BtfError, match="struct outer has no missing"):
        btf.offset("outer", "missing")
    with pytest.raises(BtfError, match="bitfield"):
        btf.offset("bits", "bf")
    with pytest.raises(BtfError, match="not BTF data"):
        Btf(b"\0" * 32)
    with pytest.raises(BtfError, match="truncated"):
        Btf(b"\x9f\xeb")


def test_btf_programs_do_not_count_nested_events() -> None:
    """Counting events skipped on a busy CPU is the classic programs' (refused before
    anything loads)."""
    from iotune.trace.bpf import ReqSizeTracer

    with pytest.raises(ValueError, match="nested"):
        ReqSizeTracer([1], btf=True, nested=True)


def test_a_missing_vmlinux_btf_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from iotune.trace import btf as module

    monkeypatch.setattr(module, "VMLINUX", tmp_path / "vmlinux")
    with pytest.raises(BtfError, match="vmlinux: No such file"):
        Btf.vmlinux()


def test_doctor_says_when_trace_falls_back_to_classic_programs(tmp_path: Path) -> None:
    """No BTF, BTF without the fields the programs read, data that is not BTF: a warning
    naming the classic programs and why."""
    from iotune.checks import Status
    from iotune.doctor import check_btf
    from iotune.probes.sysfs import SysTree

    tree = SysTree(tmp_path)
    got = check_btf(tree)
    assert got.status == Status.WARN and "no /sys/kernel/btf/vmlinux" in got.found
    vmlinux = tmp_path / "sys/kernel/btf/vmlinux"
    vmlinux.parent.mkdir(parents=True)
    vmlinux.write_bytes(sample_blob())  # BTF, but no struct request
    got = check_btf(tree)
    assert got.status == Status.WARN, got
    assert got.found == (
        "trace falls back to classic tracepoint programs: the kernel's BTF has no request"
    )
    vmlinux.write_bytes(b"\0" * 64)
    assert "not BTF data" in check_btf(tree).found


def test_malformed_btf_is_a_btf_error() -> None:
    """What the reader cannot make sense of falls back, never escapes as another error."""
    from iotune.trace.btf import btf_cflags

    class Broken(Btf):  # BTF whose types point where nothing is
        def offset(self, struct_name: str, path: str) -> int:
            raise IndexError("list index out of range")

    with pytest.raises(BtfError, match=r"malformed BTF data \(IndexError"):
        btf_cflags(Broken(sample_blob()))
