"""The running kernel's BTF (/sys/kernel/btf/vmlinux): struct field offsets and enum values
for the tracer's BTF tracepoint programs, and loading and attaching such programs.

A BTF tracepoint program (libbpf's ``tp_btf``) gets the tracepoint's own arguments (a
``struct request *``) and reads their fields with plain loads that the verifier checks
against the kernel's types. A classic tracepoint program is handed a record that the kernel
fills first with every field of the event (device, sector, the rwbs string, the task's
name, the command), whether the program reads it or not. The fields' offsets come from the
kernel's BTF, not from the installed headers (those may be another kernel's), so the
programs are compiled for the running kernel: what libbpf's CO-RE does, by hand.

bcc compiles the programs; it cannot load a program of this kind, so it is loaded here with
the bpf() system call (BPF_PROG_LOAD, then BPF_RAW_TRACEPOINT_OPEN).
"""

from __future__ import annotations

import ctypes
import os
import struct
from dataclasses import dataclass
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")

# BTF kinds (include/uapi/linux/btf.h) and the bytes each adds after the 12-byte btf_type
KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM = 1, 2, 3, 4, 5, 6
KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT = 8, 9, 10, 11
KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC, KIND_DECL_TAG, KIND_TYPE_TAG, KIND_ENUM64 = (
    13,
    14,
    15,
    17,
    18,
    19,
)
_FIXED = {KIND_INT: 4, KIND_ARRAY: 12, KIND_VAR: 4, KIND_DECL_TAG: 4}
_PER_MEMBER = {
    KIND_STRUCT: 12,
    KIND_UNION: 12,
    KIND_ENUM: 8,
    KIND_FUNC_PROTO: 8,
    KIND_DATASEC: 12,
    KIND_ENUM64: 12,
}
_MODIFIERS = (KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG)

SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
BPF_PROG_LOAD, BPF_RAW_TRACEPOINT_OPEN = 5, 17
BPF_PROG_TYPE_TRACING = 26


class BtfError(Exception):
    """The kernel has no BTF, or not the types or members asked for."""


@dataclass(frozen=True)
class _Type:
    offset: int  # of its btf_type in the data
    kind: int
    vlen: int
    kind_flag: bool
    name_off: int
    size_or_type: int


class Btf:
    """A parsed BTF blob: types by id, looked up by kind and name."""

    def __init__(self, data: bytes) -> None:
        if len(data) < 24:
            raise BtfError("BTF data is truncated")
        magic, _ver, _flags, hdr_len, type_off, type_len, str_off, _str_len = struct.unpack_from(
            "<HBBIIIII", data, 0
        )
        if magic != 0xEB9F:
            raise BtfError(f"not BTF data (magic {magic:#x})")
        self._data = data
        self._strings = hdr_len + str_off
        self._types: list[_Type | None] = [None]  # id 0 is void
        self._by_name: dict[tuple[int, str], int] = {}
        pos, end = hdr_len + type_off, hdr_len + type_off + type_len
        if end > len(data) or self._strings > len(data):
            raise BtfError("BTF data is truncated")
        while pos < end:
            if pos + 12 > end:
                raise BtfError("BTF data is truncated")
            name_off, info, size = struct.unpack_from("<III", data, pos)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            if kind > KIND_ENUM64:
                raise BtfError(f"BTF kind {kind} is newer than this reader")
            self._types.append(_Type(pos, kind, vlen, bool(info >> 31), name_off, size))
            pos += 12 + _FIXED.get(kind, 0) + _PER_MEMBER.get(kind, 0) * vlen

    @classmethod
    def vmlinux(cls, path: Path | None = None) -> Btf:
        path = path or VMLINUX  # looked up at the call: a test points it elsewhere
        try:
            return cls(path.read_bytes())
        except OSError as exc:
            raise BtfError(f"{path}: {exc.strerror}") from exc
        except struct.error as exc:
            raise BtfError(f"{path}: malformed BTF ({exc})") from exc

    def _name(self, off: int) -> str:
        start = self._strings + off
        try:
            return self._data[start : self._data.index(b"\0", start)].decode()
        except (ValueError, UnicodeDecodeError) as exc:
            raise BtfError(f"BTF string at {off} is malformed") from exc

    def type_name(self, tid: int) -> str:
        """A type as C spells it, for the few kinds a tracepoint's arguments use:
        ``struct request *``, ``unsigned int``, ``blk_status_t``."""
        t = self._types[tid] if 0 <= tid < len(self._types) else None
        if t is None:
            return "void"
        if t.kind == KIND_PTR:
            return self.type_name(t.size_or_type) + " *"
        if t.kind in (KIND_CONST, KIND_VOLATILE, KIND_RESTRICT, KIND_TYPE_TAG):
            return self.type_name(t.size_or_type)
        name = self._name(t.name_off)
        if t.kind == KIND_STRUCT:
            return f"struct {name}"
        if t.kind == KIND_UNION:
            return f"union {name}"
        return name

    def tracepoint_args(self, typedef: int) -> tuple[str, ...]:
        """The arguments a tracepoint passes its programs, from its ``btf_trace_*`` typedef
        (a pointer to ``void (void *, ARGS...)``): the first, the tracepoint's data, left
        out."""
        t = self._types[self._resolve(typedef)]
        if t is None or t.kind != KIND_PTR:
            raise BtfError(f"type {typedef} is not a btf_trace_* typedef")
        proto = self._types[self._resolve(t.size_or_type)]
        if proto is None or proto.kind != KIND_FUNC_PROTO:
            raise BtfError(f"type {typedef} is not a btf_trace_* typedef")
        params = [
            struct.unpack_from("<II", self._data, proto.offset + 12 + 8 * i)[1]
            for i in range(proto.vlen)
        ]
        return tuple(self.type_name(p) for p in params[1:])

    def find(self, kind: int, name: str) -> int:
        """The id of the type *name* of *kind*."""
        if not self._by_name:
            for tid, t in enumerate(self._types):
                if t is not None and t.name_off:
                    self._by_name.setdefault((t.kind, self._name(t.name_off)), tid)
        try:
            return self._by_name[(kind, name)]
        except KeyError:
            raise BtfError(f"the kernel's BTF has no {name}") from None

    def _resolve(self, tid: int) -> int:
        t = self._types[tid]
        while t is not None and t.kind in _MODIFIERS:
            tid = t.size_or_type
            t = self._types[tid]
        return tid

    def _members(self, tid: int) -> list[tuple[str, int, int]]:
        """(name, type id, offset in bits) of a struct's or union's members."""
        t = self._types[tid]
        if t is None or t.kind not in (KIND_STRUCT, KIND_UNION):
            raise BtfError(f"type {tid} is not a struct or union")
        out = []
        for i in range(t.vlen):
            name_off, mtype, moff = struct.unpack_from("<III", self._data, t.offset + 12 + 12 * i)
            # with kind_flag, the high 8 bits hold a bitfield's size
            out.append((self._name(name_off), mtype, moff & 0xFFFFFF if t.kind_flag else moff))
        return out

    def _offset_in(self, tid: int, name: str) -> tuple[int, int] | None:
        """(bit offset, type id) of member *name* of a struct or union, looking into its
        anonymous structs and unions."""
        for mname, mtype, moff in self._members(tid):
            if mname == name:
                return moff, mtype
            inner = self._resolve(mtype)
            t = self._types[inner]
            if not mname and t is not None and t.kind in (KIND_STRUCT, KIND_UNION):
                found = self._offset_in(inner, name)
                if found is not None:
                    return moff + found[0], found[1]
        return None

    def offset(self, struct_name: str, path: str) -> int:
        """The byte offset of a member, ``"bi_iter.bi_size"`` for one in a member struct."""
        tid = self.find(KIND_STRUCT, struct_name)
        bits = 0
        for part in path.split("."):
            found = self._offset_in(self._resolve(tid), part)
            if found is None:
                raise BtfError(f"the kernel's struct {struct_name} has no {path}")
            bits += found[0]
            tid = found[1]
        if bits % 8:
            raise BtfError(f"{struct_name}.{path} is a bitfield")
        return bits // 8

    def enum(self, name: str) -> dict[str, int]:
        t = self._types[self.find(KIND_ENUM, name)]
        out: dict[str, int] = {}
        if t is None:
            return out
        for i in range(t.vlen):
            name_off, value = struct.unpack_from("<Ii", self._data, t.offset + 12 + 8 * i)
            out[self._name(name_off)] = value
        return out


class _ProgLoad(ctypes.Structure):  # union bpf_attr, BPF_PROG_LOAD
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
        ("prog_ifindex", ctypes.c_uint32),
        ("expected_attach_type", ctypes.c_uint32),
        ("prog_btf_fd", ctypes.c_uint32),
        ("func_info_rec_size", ctypes.c_uint32),
        ("func_info", ctypes.c_uint64),
        ("func_info_cnt", ctypes.c_uint32),
        ("line_info_rec_size", ctypes.c_uint32),
        ("line_info", ctypes.c_uint64),
        ("line_info_cnt", ctypes.c_uint32),
        ("attach_btf_id", ctypes.c_uint32),
        ("attach_btf_obj_fd", ctypes.c_uint32),
    ]


class _RawTpOpen(ctypes.Structure):  # union bpf_attr, BPF_RAW_TRACEPOINT_OPEN
    _fields_ = [("name", ctypes.c_uint64), ("prog_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    nr = SYS_BPF.get(os.uname().machine)
    if nr is None:
        raise BtfError(f"no bpf() system call number known for {os.uname().machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(libc.syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr)))
    if fd < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return fd


def attach_tp_btf(
    insns: int, size: int, license: bytes, name: str, btf_id: int, attach_type: int
) -> tuple[int, int]:
    """Load the compiled program at *insns* (*size* bytes, map references already resolved
    to fds) as a BTF tracepoint program of the tracepoint whose ``btf_trace_*`` typedef is
    *btf_id*, and attach it. Returns (program fd, link fd): closing both detaches it."""
    log = ctypes.create_string_buffer(1 << 16)
    lic = ctypes.create_string_buffer(license)
    attr = _ProgLoad(
        prog_type=BPF_PROG_TYPE_TRACING,
        insn_cnt=size // 8,
        insns=insns,
        license=ctypes.addressof(lic),
        log_level=0,
        prog_name=name[:15].encode(),
        expected_attach_type=attach_type,
        attach_btf_id=btf_id,
    )
    try:
        prog = _bpf(BPF_PROG_LOAD, attr)
    except OSError:
        # again with the verifier's log, to say why
        attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
        try:
            prog = _bpf(BPF_PROG_LOAD, attr)
        except OSError as exc:
            why = log.value.decode(errors="replace").strip().splitlines()
            raise BtfError(f"loading {name}: {exc.strerror}: {why[-1] if why else ''}") from exc
    try:
        link = attach(prog)
    except BtfError as exc:
        os.close(prog)
        raise BtfError(f"attaching {name}: {exc}") from exc
    return prog, link


def attach(prog: int) -> int:
    """Attach a loaded BTF tracepoint program (again); returns the link fd."""
    try:
        return _bpf(BPF_RAW_TRACEPOINT_OPEN, _RawTpOpen(name=0, prog_fd=prog))
    except OSError as exc:
        raise BtfError(str(exc.strerror)) from exc


# ------------------------------------------------- the bcc build's BTF programs, compiled


#: -D name -> (struct, member path) of the fields the BTF programs read
BTF_FIELDS = {
    "RQ_Q": ("request", "q"),
    "RQ_CMD_FLAGS": ("request", "cmd_flags"),
    "RQ_DATA_LEN": ("request", "__data_len"),
    "RQ_SECTOR": ("request", "__sector"),
    "RQ_BIO": ("request", "bio"),
    "Q_DISK": ("request_queue", "disk"),
    "GD_MAJOR": ("gendisk", "major"),
    "GD_FIRST_MINOR": ("gendisk", "first_minor"),
    "BIO_BDEV": ("bio", "bi_bdev"),
    "BIO_OPF": ("bio", "bi_opf"),
    "BIO_SIZE": ("bio", "bi_iter.bi_size"),
    "BDEV_DISK": ("block_device", "bd_disk"),
}
REQ_OPS = ("READ", "WRITE", "FLUSH", "DISCARD", "SECURE_ERASE")
#: the arguments each tracepoint passes that the BTF programs read (ctx[0], ctx[1], ...)
BTF_ARGS = {
    "block_rq_issue": ("struct request *",),
    "block_rq_requeue": ("struct request *",),
    "block_rq_complete": ("struct request *", "blk_status_t", "unsigned int"),
    "block_rq_insert": ("struct request *",),
    "block_bio_queue": ("struct bio *",),
}


def btf_cflags(btf: Btf | None = None, owners: bool = True) -> tuple[list[str], dict[str, int]]:
    """The -D flags that compile the BTF programs for the running kernel (field offsets and
    req_op values), and the BTF ids to attach them by (``attach_type``: BPF_TRACE_RAW_TP).
    BtfError where the kernel has no BTF, not these fields, or tracepoints whose arguments
    are not the ones the programs read (before 5.11 the request's came second), or BTF data
    this reader cannot make sense of."""
    try:
        return _btf_cflags(btf or Btf.vmlinux(), owners)
    except (IndexError, KeyError, ValueError, UnicodeDecodeError, struct.error) as exc:
        raise BtfError(f"malformed BTF data ({type(exc).__name__}: {exc})") from exc


def _btf_cflags(btf: Btf, owners: bool) -> tuple[list[str], dict[str, int]]:
    flags = [f"-D{macro}={btf.offset(*where)}" for macro, where in BTF_FIELDS.items()]
    try:
        ops = btf.enum("req_op")
    except BtfError:
        ops = btf.enum("req_opf")  # its name before 6.0
    for op in REQ_OPS:
        if f"REQ_OP_{op}" not in ops:
            raise BtfError(f"the kernel's req_op has no REQ_OP_{op}")
        flags.append(f"-DREQ_OP_{op}_V={ops[f'REQ_OP_{op}']}")
    ids = {}
    for event, args in BTF_ARGS.items():
        if event == "block_bio_queue" and not owners:
            continue
        ids[event] = btf.find(KIND_TYPEDEF, f"btf_trace_{event}")
        got = btf.tracepoint_args(ids[event])
        if got[: len(args)] != args or len(got) != len(args):
            raise BtfError(
                f"the kernel's {event} passes ({', '.join(got)}), not ({', '.join(args)})"
            )
    ids["attach_type"] = btf.enum("bpf_attach_type")["BPF_TRACE_RAW_TP"]
    return flags, ids
