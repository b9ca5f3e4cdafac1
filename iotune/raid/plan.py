"""Pure planning: probe records + a request → a plan (ordered steps, each with its reason)
or a refusal naming every blocking fact. No I/O here, so every safety rule is unit-testable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from iotune.errors import DeviceNotFound, IotuneError, UsageError
from iotune.probes.blockdev import BlockDevice, Transport, Use
from iotune.raid.model import (
    LEVELS,
    MIN_DEVICES,
    ArrayInfo,
    Fs,
    HostSetup,
    Plan,
    RaidRequest,
    Step,
)
from iotune.units import format_size

MIB = 2**20
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")
#: reasons --wipe can clear: a signature and nothing else
WIPEABLE = {Use.SIGNATURE}


class Refused(IotuneError):
    """The plan cannot be made: every reason, one per line."""

    exit_code = 1

    def __init__(self, what: str, reasons: Sequence[str], hint: str | None = None) -> None:
        super().__init__(f"refusing to {what}: " + "; ".join(reasons), hint=hint)
        self.what = what
        self.reasons = list(reasons)

    def show(self, file: object = None) -> None:
        import click

        click.echo(f"iotune: error: refusing to {self.what}:", err=True)
        for r in self.reasons:
            click.echo(f"  - {r}", err=True)
        if self.hint:
            click.echo(f"hint: {self.hint}", err=True)


@dataclass(frozen=True)
class Uuids:
    array: str  # mdadm form: 8:8:8:8 hex
    fs: str  # RFC 4122 form


def data_disks(level: int, n: int) -> int:
    return {0: n, 1: 1, 5: n - 1, 6: n - 2, 10: n // 2}[level]


def capacity(level: int, sizes: Sequence[int]) -> int:
    """Approximate usable bytes. md 1.2 keeps a data offset at the start of each member
    (at least 1 MiB, up to 128 MiB on large drives); RAID0 uses every member whole (zones),
    the others the smallest member times the data disks."""
    usable = [max(0, s - max(MIB, min(128 * MIB, s // 1000))) for s in sizes]
    if level == 0:
        return sum(usable)
    return data_disks(level, len(sizes)) * min(usable)


def device_problems(d: BlockDevice, *, wipe: bool) -> list[str]:
    """Every reason *d* may not become a member (empty: it may)."""
    problems = []
    if d.transport in (Transport.MD, Transport.DM, Transport.RAM):
        problems.append(f"{d.path} is itself a {d.transport.value} device, not a drive")
    if d.read_only:
        problems.append(f"{d.path} is read-only")
    for r in d.in_use:
        if r.kind in WIPEABLE and wipe:
            continue
        extra = " (--wipe erases signatures)" if r.kind in WIPEABLE else ""
        problems.append(f"{d.path}: {r.detail}{extra}")
    return problems


def signatures_to_wipe(d: BlockDevice) -> list[str]:
    return [f"{s.type} at {s.offset}" for s in d.signatures if s.device == d.name]


def check_request(req: RaidRequest) -> list[str]:
    problems = []
    if not NAME_RE.fullmatch(req.name):
        problems.append(f"name {req.name!r}: use up to 32 letters, digits, '_', '-', '.'")
    if req.level not in LEVELS:
        problems.append(f"level {req.level}: iotune builds RAID {', '.join(map(str, LEVELS))}")
    if req.level != 1 and (req.chunk < 4096 or req.chunk & (req.chunk - 1)):
        problems.append(f"chunk {req.chunk} bytes: must be a power of two of at least 4K")
    if req.mount is not None:
        if not req.mount.startswith("/") or req.mount.rstrip("/") == "":
            problems.append(f"mount point {req.mount!r}: must be an absolute path other than /")
        if req.fs is Fs.NONE:
            problems.append("--mount needs a filesystem (--fs xfs or ext4)")
    if req.persist and req.fs is not Fs.NONE and req.mount is None:
        problems.append("--persist with a filesystem needs --mount (the fstab entry needs a place)")
    return problems


def plan_create(
    disks: Sequence[BlockDevice],
    req: RaidRequest,
    setup: HostSetup,
    uuids: Uuids,
    *,
    mounted_paths: Iterable[str] = (),
) -> Plan:
    """Plan `mdadm --create` + mkfs + mount (+ persistence) over *disks* (already chosen)."""
    problems = check_request(req)
    names = [d.name for d in disks]
    for dup in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"/dev/{dup} is named twice")
    for d in disks:
        problems += device_problems(d, wipe=req.wipe)
        others = [o.size_bytes for o in disks if o.name != d.name]
        if others and d.size_bytes < 0.01 * max(others):
            problems.append(
                f"{d.path} ({format_size(d.size_bytes)}) is smaller than 1% of the others' size"
            )
    need = MIN_DEVICES.get(req.level, 2)
    if len(disks) < need:
        problems.append(f"RAID{req.level} needs at least {need} drives, got {len(disks)}")
    if req.mount is not None and req.mount.rstrip("/") in {m.rstrip("/") for m in mounted_paths}:
        problems.append(f"{req.mount} is already a mount point")
    if problems:
        raise Refused(
            f"build /dev/md/{req.name}",
            problems,
            hint="nothing was touched; 'iotune devices' shows every drive and why it is in use",
        )

    dev = f"/dev/md/{req.name}"
    members = tuple(d.path for d in disks)
    n = len(disks)
    dd = data_disks(req.level, n)
    steps: list[Step] = []
    wipes = []
    for d in disks:
        sigs = signatures_to_wipe(d)
        if sigs:
            wipes.append(d.path)
            steps.append(
                Step(
                    "wipe",
                    f"erase {', '.join(sigs)} on {d.path} (--wipe)",
                    argv=("wipefs", "--all", d.path),
                )
            )
    create = ["mdadm", "--create", dev, f"--level={req.level}", f"--raid-devices={n}"]
    if req.level != 1:
        create.append(f"--chunk={req.chunk // 1024}K")
    create += [
        "--metadata=1.2",
        "--homehost=any",
        f"--name={req.name}",
        f"--uuid={uuids.array}",
        "--run",
        *members,
    ]
    layout = f"chunk {format_size(req.chunk)}, " if req.level != 1 else ""
    steps.append(
        Step(
            "create",
            f"RAID{req.level} over {n} drives ({layout}{dd} data disk{'s' if dd > 1 else ''}); "
            "--run only after every check above passed",
            argv=tuple(create),
        )
    )
    steps.append(
        Step(
            "wait",
            f"wait for {dev} and its udev links, then verify level, chunk and members (mdadm --detail, /proc/mdstat, sysfs)",
        )
    )
    alignment = None
    if req.fs is not Fs.NONE:
        label = req.name[:12]  # XFS labels hold 12 characters
        if req.fs is Fs.XFS:
            mkfs = ["mkfs.xfs", "-L", label, "-m", f"uuid={uuids.fs}"]
            if req.level != 1:
                alignment = f"su={req.chunk // 1024}k,sw={dd}"
                mkfs += ["-d", alignment]
        else:
            mkfs = ["mkfs.ext4", "-q", "-L", label, "-U", uuids.fs]
            if req.level != 1:
                stride = req.chunk // 4096
                alignment = f"stride={stride},stripe_width={stride * dd}"
                mkfs += ["-E", alignment]
        mkfs += [*req.mkfs_options, dev]
        why = (
            f"{req.fs.value} aligned to the stripe ({alignment})"
            if alignment
            else f"{req.fs.value}"
        )
        steps.append(Step("mkfs", why, argv=tuple(mkfs)))
    if req.mount is not None:
        steps.append(
            Step("mkdir", f"create the mount point {req.mount}", argv=("mkdir", "-p", req.mount))
        )
        steps.append(
            Step(
                "mount",
                "noatime: offload files are rewritten constantly, access times are waste",
                argv=("mount", "-o", "noatime", dev, req.mount),
            )
        )
    notes = []
    if req.persist:
        conf = f"ARRAY {dev} metadata=1.2 UUID={uuids.array} name=any:{req.name}"
        steps.append(
            Step("conf", "assemble the array by name at boot", path=setup.mdadm_conf, line=conf)
        )
        if setup.initramfs:
            steps.append(
                Step(
                    "initramfs", "the initramfs carries a copy of mdadm.conf", argv=setup.initramfs
                )
            )
        elif setup.initramfs_note:
            notes.append(setup.initramfs_note)
        if req.mount is not None and req.fs is not Fs.NONE:
            line = f"UUID={uuids.fs} {req.mount} {req.fs.value} noatime,nofail 0 0"
            steps.append(
                Step(
                    "fstab",
                    "mount at boot by filesystem UUID; nofail keeps boot going "
                    "if a drive is missing",
                    path=setup.fstab,
                    line=line,
                )
            )
    if req.level in (5, 6):
        notes.append(
            "RAID5/6 start with a background resync; the volume is usable meanwhile, slower"
        )
    mixed = fabric_note(disks)
    if mixed:
        notes.append(mixed)
    return Plan(
        request=req,
        device=dev,
        members=members,
        member_size=min(d.size_bytes for d in disks),
        capacity_bytes=capacity(req.level, [d.size_bytes for d in disks]),
        data_disks=dd,
        alignment=alignment,
        array_uuid=uuids.array,
        fs_uuid=uuids.fs if req.fs is not Fs.NONE else None,
        steps=tuple(steps),
        wipes=tuple(wipes),
        notes=tuple(notes),
    )


def fabric_note(disks: Sequence[BlockDevice]) -> str | None:
    """The warning for an array of local drives and NVMe-oF namespaces together: each request
    is striped over all of them, so the array goes at its slowest member's pace, named by
    its path (the slowest link; one that reports no speed counts as slowest)."""
    remote = [d for d in disks if d.fabric is not None]
    if not remote or len(remote) == len(disks):
        return None
    slowest = min(remote, key=lambda d: (d.fabric.link_bytes_s() or 0.0) if d.fabric else 0.0)
    where = slowest.fabric.describe() if slowest.fabric else "?"
    return (
        f"warning: {len(disks) - len(remote)} local drive(s) and {len(remote)} NVMe-oF "
        "namespace(s) in one array: every request is striped over all of them, so the array "
        f"goes at its slowest member's pace; the slowest path: {slowest.path} over {where}"
    )


def choose_unused(disks: Sequence[BlockDevice]) -> list[BlockDevice]:
    """--all-unused: every NVMe drive with no reason to be in use."""
    return [d for d in disks if d.transport is Transport.NVME and not d.in_use]


def pick_members(
    disks: Sequence[BlockDevice], req: RaidRequest, names: Sequence[str]
) -> list[BlockDevice]:
    """The drives to build on: every free NVMe drive (--all-unused), or the *names* the
    request's devices resolved to, in that order."""
    if req.all_unused:
        chosen = choose_unused(disks)
        if not chosen:
            raise UsageError(
                "no free NVMe drives", hint="'iotune devices' shows why each drive is in use"
            )
        return chosen
    by_name = {d.name: d for d in disks}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise DeviceNotFound(missing[0])
    return [by_name[n] for n in names]


def existing_members(info: ArrayInfo) -> list[str]:
    """The kernel names of an existing array's members, sorted."""
    return sorted(m["device"].removeprefix("/dev/") for m in info.members if m["device"])


def matches_existing(info: ArrayInfo, req: RaidRequest, names: Sequence[str] | None) -> bool:
    """Whether the array already there is the one asked for: same level, same chunk (RAID1
    has none) and, when drives were named (*names*, resolved), the same members.
    Re-running a create that matches changes nothing."""
    return (
        info.level == f"raid{req.level}"
        and (req.level == 1 or info.chunk_bytes == req.chunk)
        and (names is None or sorted(names) == existing_members(info))
    )


@dataclass(frozen=True)
class ArrayFacts:
    """What destroy needs to know about an existing array (found by the caller)."""

    name: str
    device: str  # /dev/md/NAME
    kernel_name: str  # md127
    members: tuple[str, ...]  # /dev/nvme0n1 ... (as md lists them, may be partitions)
    mountpoints: tuple[str, ...]
    holders: tuple[str, ...]
    open_by: tuple[str, ...]  # "pid 123 (python3): /mnt/offload/x"
    swap: bool
    conf_lines: tuple[tuple[str, str], ...]  # (path, line) entries that name this array
    fstab_lines: tuple[tuple[str, str], ...]


def plan_destroy(a: ArrayFacts, *, wipe_members: bool, setup: HostSetup) -> list[Step]:
    problems = []
    if a.open_by:
        problems += [f"{a.device} is busy: {o}" for o in a.open_by]
    if a.holders:
        problems.append(f"{a.device} is held by {', '.join(a.holders)} (remove that first)")
    if a.swap:
        problems.append(f"{a.device} is active swap")
    if problems:
        raise Refused(
            f"destroy {a.device}",
            problems,
            hint="stop what uses the volume (lsof/fuser show it), then run this again",
        )
    steps = [Step("umount", f"unmount {m}", argv=("umount", m)) for m in a.mountpoints]
    steps += [
        Step("unfstab", "the volume is going away", path=p, line=line) for p, line in a.fstab_lines
    ]
    steps += [
        Step("unconf", "the array is going away", path=p, line=line) for p, line in a.conf_lines
    ]
    if a.conf_lines and setup.initramfs:
        steps.append(
            Step(
                "initramfs",
                "drop the array from the initramfs copy of mdadm.conf",
                argv=setup.initramfs,
            )
        )
    steps.append(Step("stop", "stop the array", argv=("mdadm", "--stop", a.device)))
    steps.append(
        Step(
            "zero",
            "erase the md superblocks so nothing reassembles it",
            argv=("mdadm", "--zero-superblock", *a.members),
        )
    )
    if wipe_members:
        steps += [
            Step(
                "wipe",
                f"erase any remaining signature on {m} (--wipe-members)",
                argv=("wipefs", "--all", m),
            )
            for m in a.members
        ]
    return steps
