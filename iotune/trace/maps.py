"""The key and value layouts of the tracers' hash maps (bpf/iotune.h), as ctypes: what the
libbpf backend reads them with (bcc makes its own from the source)."""

from __future__ import annotations

import ctypes
from typing import Any


class SizeKey(ctypes.Structure):  # struct size_key in bpf/iotune.h
    _fields_ = [
        ("dev", ctypes.c_uint32),
        ("op", ctypes.c_uint32),
        ("bytes", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class DoneKey(ctypes.Structure):  # struct done_key
    _fields_ = [("dev", ctypes.c_uint32), ("op", ctypes.c_uint32)]


class DoneVal(ctypes.Structure):  # struct done_val
    _fields_ = [("ios", ctypes.c_uint64), ("sectors", ctypes.c_uint64)]


class OwnerKey(ctypes.Structure):  # struct owner_key
    _fields_ = [
        ("dev", ctypes.c_uint32),
        ("op", ctypes.c_uint32),
        ("tgid", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


class OwnerVal(ctypes.Structure):  # struct owner_val
    _fields_ = [("bios", ctypes.c_uint64), ("sectors", ctypes.c_uint64)]


class CommVal(ctypes.Structure):  # struct comm_val
    _fields_ = [("comm", ctypes.c_char * 16)]


#: key and value types of the hash maps read (bcc makes its own from the source)
MAP_TYPES: dict[str, tuple[Any, Any]] = {
    "sizes": (SizeKey, ctypes.c_uint64),
    "done": (DoneKey, DoneVal),
    "owners": (OwnerKey, OwnerVal),
    "comms": (ctypes.c_uint32, CommVal),
    "devices": (ctypes.c_uint32, ctypes.c_uint32),
    "workload": (ctypes.c_uint32, ctypes.c_uint8),
}
