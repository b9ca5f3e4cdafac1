"""The shipped CO-RE object is the one its sources build: the sidecar bpf/build.sh writes
names the sha256 of each source and of the object, and the loader refuses an object whose
hash is not the sidecar's. The constants the programs and the readers share agree."""

from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
from pathlib import Path

import pytest

from iotune.errors import IotuneError
from iotune.trace import libbpf, mapreader

BPF = Path(__file__).resolve().parents[2] / "bpf"


def _sidecar() -> dict[str, str]:
    lines = (BPF / libbpf.SIDECAR).read_text().splitlines()
    return {f: h for h, _, f in (ln.partition("  ") for ln in lines if not ln.startswith("#"))}


def test_the_object_was_built_from_the_sources_beside_it() -> None:
    want = _sidecar()
    assert set(want) == {"bpf/reqsize.core.bpf.c", "bpf/iotune.h", "bpf/reqsize.core.bpf.o"}
    for name, digest in want.items():
        # a source edited without bpf/build.sh run after it fails here
        assert hashlib.sha256((BPF.parent / name).read_bytes()).hexdigest() == digest, name
    libbpf.check_object()


def test_a_stale_object_is_refused(tmp_path: Path) -> None:
    for name in (libbpf.OBJECT, libbpf.SIDECAR):
        shutil.copy(BPF / name, tmp_path / name)
    libbpf.check_object(tmp_path / libbpf.OBJECT)
    with (tmp_path / libbpf.OBJECT).open("ab") as f:
        f.write(b"\0")
    with pytest.raises(IotuneError, match="is not the object its sidecar names") as info:
        libbpf.check_object(tmp_path / libbpf.OBJECT)
    assert info.value.hint is not None and "bpf/build.sh" in info.value.hint


def test_the_programs_and_the_readers_share_their_constants() -> None:
    src = (BPF / "reqsize.core.bpf.c").read_text()
    defines = dict(re.findall(r"^#define (\w+) (0x[0-9a-f]+|\d+)$", src, re.M))
    for name in ("SLOT_DEVS", "SLOT_SECTORS", "DONE_OPS", "OWNER_OPS", "MAX_SIZES", "NO_ROW"):
        assert int(defines[name], 0) == getattr(mapreader, name), name
    fields = re.search(r"struct config \{(.*?)\};", src, re.S)
    assert fields is not None
    members = re.findall(r"(u32|u64) (\w+)(?:\[(\w+)\])?;", fields.group(1))
    assert [m for _, m, _ in members] == [f[0] for f in libbpf.Config._fields_]
    # each member's width, as ctypes lays it out: the .rodata the loader checks by size
    sizes = {"u32": 4, "u64": 8}
    for (kind, name, count), field in zip(members, libbpf.Config._fields_, strict=True):
        want = sizes[kind] * (getattr(mapreader, count) if count else 1)
        assert ctypes.sizeof(field[1]) == want, (name, field[0])
