"""Offload volumes as a study axis: ``--volume NAME=DIR[,aio=SWEEP_RUN]``, each resolved to
the drives behind it (a plain drive, or an md array and its members) and checked before
anything runs: it exists, is writable with O_DIRECT, is not on the root drive (unless
--force), and no two volumes share a drive."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from iotune.errors import UsageError
from iotune.probes.sysfs import SysTree


@dataclass(frozen=True)
class Volume:
    name: str
    path: str
    aio_config: str | None = None  # the sweep that belongs to this volume
    drives: tuple[str, ...] = ()  # the whole disks that serve its requests
    level: str | None = None  # md level ("raid0"), None for a plain drive
    chunk_bytes: int | None = None
    array: str | None = None  # the md device, if any

    @property
    def members(self) -> int:
        return len(self.drives)

    def describe(self) -> str:
        what = (
            f"{self.level} {self.array} over {self.members} drive(s) "
            f"({', '.join(self.drives)}"
            + (f", chunk {self.chunk_bytes // 1024} KiB" if self.chunk_bytes else "")
            + ")"
            if self.level
            else f"one drive ({', '.join(self.drives)})"
        )
        return f"{self.name}: {self.path} on {what}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "drives": list(self.drives), "members": self.members}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Volume:
        return Volume(
            name=d["name"],
            path=d["path"],
            aio_config=d.get("aio_config"),
            drives=tuple(d.get("drives") or ()),
            level=d.get("level"),
            chunk_bytes=d.get("chunk_bytes"),
            array=d.get("array"),
        )


def parse_volume(text: str) -> tuple[str, str, str | None]:
    """NAME=DIR or NAME=DIR,aio=SWEEP_RUN."""
    name, sep, rest = text.partition("=")
    path, _, opt = rest.partition(",aio=")
    name = name.strip()
    if not sep or not name or not path.strip():
        raise UsageError(
            f"--volume {text!r} is not NAME=DIR",
            hint="e.g. --volume single=/mnt/nvme0 --volume raid0x4=/mnt/md0,aio=results/sweep-md0",
        )
    if not name.replace("-", "").replace("_", "").isalnum():
        raise UsageError(
            f"--volume {text!r}: the name {name!r} may hold letters, digits, - and _",
            hint="e.g. --volume raid0x4=/mnt/md0",
        )
    return name, path.strip(), opt.strip() or None


def root_disks(tree: SysTree) -> set[str]:
    """The drives behind /; none where / is on no drive (a guest's 9p or virtiofs root, a
    container's overlay): then no volume can share one with it."""
    from iotune.trace.targets import resolve_path

    try:
        return set(resolve_path(tree, "/").disks)
    except UsageError:
        return set()


def probe_volume(
    tree: SysTree, name: str, path: str, aio: str | None, force: bool = False
) -> Volume:
    """The volume behind *path*, checked (module docstring)."""
    from iotune.checks import o_direct_error
    from iotune.trace.targets import resolve_path

    p = Path(path).resolve()
    if not p.is_dir():
        raise UsageError(
            f"--volume {name}: {path} is not a directory"
            + ("" if p.exists() else " (it does not exist)"),
            hint="mount the volume first, e.g. iotune raid create ... --mount /mnt/md0",
        )
    err = o_direct_error(p)
    if err is not None:
        import os

        raise UsageError(
            f"--volume {name}: cannot write an O_DIRECT file in {path}: "
            f"{os.strerror(err.errno or 0)}",
            hint="DeepSpeed swaps with O_DIRECT: name a writable directory on a drive",
        )
    if aio is not None and not Path(aio).exists():
        raise UsageError(
            f"--volume {name}: its sweep {aio} does not exist",
            hint=f"iotune sweep-aio --target {path} --out SWEEP; then --volume {name}={path},aio=SWEEP",
        )
    t = resolve_path(tree, str(p))
    if not force:
        root = root_disks(tree)
        shared = sorted(root & set(t.disks))
        if shared:
            raise UsageError(
                f"--volume {name}: {path} lies on the root drive ({', '.join(shared)})",
                hint="offload to a drive of its own, or --force to use it anyway",
            )
    arr = next((a for a in t.arrays if a.level), None)
    return Volume(
        name=name,
        path=str(p),
        aio_config=str(Path(aio).resolve()) if aio else None,
        drives=tuple(t.disks),
        level=arr.level if arr else None,
        chunk_bytes=arr.chunk_bytes if arr else None,
        array=arr.name if arr else None,
    )


#: a controller's sysfs state while it serves requests (nvme: live; SCSI: running)
_SERVING = ("live", "running")


def member_faults(tree: SysTree, v: Volume) -> list[str]:
    """What is wrong now with the drives behind *v*: a drive gone, its controller not
    serving, an md member marked faulty, the array broken. Empty while all is well (read
    after a run failed, to name the drive that failed it)."""
    out = []
    for d in v.drives:
        base = f"sys/block/{d}"
        if not tree.exists(base):
            out.append(f"drive {d} is gone (no /{base})")
            continue
        state = tree.read(f"{base}/device/state")
        if state is not None and state not in _SERVING:
            out.append(f"drive {d}: its controller is {state}")
        if v.array:
            member = tree.read(f"sys/block/{v.array}/md/dev-{d}/state")
            if member is not None and "faulty" in member.split(","):
                out.append(f"{v.array} marks its member {d} faulty")
    if v.array:
        state = tree.read(f"sys/block/{v.array}/md/array_state")
        if state in ("broken", "inactive", "readonly", "read-auto") or (
            state is None and not tree.exists(f"sys/block/{v.array}")
        ):
            out.append(f"array {v.array} is {state or 'gone'}")
    return out


def check_distinct(volumes: list[Volume]) -> None:
    """Each volume once, on drives of its own."""
    seen: dict[str, str] = {}
    names: set[str] = set()
    for v in volumes:
        if v.name in names:
            raise UsageError(f"--volume {v.name} is named twice", hint="give each volume a name")
        names.add(v.name)
        for d in v.drives:
            if d in seen:
                raise UsageError(
                    f"--volume {v.name} and --volume {seen[d]} share drive {d}: their runs "
                    "would measure the same drive",
                    hint="name volumes on different drives",
                )
            seen[d] = v.name


def volumes_from_options(
    texts: tuple[str, ...], tree: SysTree | None = None, force: bool = False
) -> list[Volume]:
    tree = tree or SysTree("/")
    vols = [probe_volume(tree, *parse_volume(t), force=force) for t in texts]
    check_distinct(vols)
    return vols
