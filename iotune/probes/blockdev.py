"""Block devices as frozen records: identity, geometry, queue limits, PCIe link, and every
reason a disk is in use.

Whole disks only (``DEVTYPE=disk``); partitions are listed inside their disk. md RAID is
bio-based and has no request queue of its own, so its queue fields describe the limits it
passes down; its members are listed under ``slaves``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from iotune.probes.fabrics import Fabric, read_fabric, target_exports
from iotune.probes.host import Host, Signature
from iotune.probes.mounts import Mount, read_mounts, read_swaps
from iotune.probes.sysfs import SysTree

SECTOR = 512  # /sys/block/*/size is always in 512-byte units, whatever the block size


class Transport(enum.StrEnum):
    NVME = "nvme"
    VIRTIO = "virtio"
    SCSI = "scsi"
    SATA = "sata"
    USB = "usb"
    MMC = "mmc"
    LOOP = "loop"
    MD = "md"
    DM = "dm"
    RAM = "ram"
    NBD = "nbd"
    OTHER = "other"


class Use(enum.StrEnum):
    MOUNTED = "mounted"
    PARTITIONS = "partitions"
    SIGNATURE = "signature"
    HOLDERS = "holders"
    SWAP = "swap"
    ROOT = "root"
    BOOT = "boot"
    BUSY = "busy"
    EXPORTED = "exported"  # a namespace of this host's NVMe-oF target (nvmet)
    NOT_LIVE = "not live"  # an NVMe-oF namespace none of whose controllers is live


@dataclass(frozen=True)
class UseReason:
    kind: Use
    detail: str

    def __str__(self) -> str:
        return self.detail


@dataclass(frozen=True)
class Partition:
    name: str
    devno: str
    size_bytes: int
    start_sector: int | None


@dataclass(frozen=True)
class PcieLink:
    current_speed: str | None
    current_width: int | None
    max_speed: str | None
    max_width: int | None

    @staticmethod
    def named(speed: str | None, width: int | None) -> str:
        """A link as iotune names it: sysfs's "8.0 GT/s PCIe" and 4 lanes as "8.0 GT/s x4"."""
        if not speed or speed == "Unknown":
            return "?"  # emulated controllers (QEMU) report no link
        s = speed.replace(" PCIe", "")
        return f"{s} x{width}" if width else s

    @property
    def current(self) -> str:
        return self.named(self.current_speed, self.current_width)

    def __str__(self) -> str:
        return f"{self.current} (max {self.named(self.max_speed, self.max_width)})"


@dataclass(frozen=True)
class QueueLimits:
    max_sectors_kb: int | None
    max_hw_sectors_kb: int | None
    nr_requests: int | None
    scheduler: str | None
    minimum_io_size: int | None
    optimal_io_size: int | None


@dataclass(frozen=True)
class BlockDevice:
    name: str
    path: str
    devno: str
    transport: Transport
    model: str | None
    serial: str | None
    firmware: str | None
    size_bytes: int
    logical_block_size: int | None
    physical_block_size: int | None
    rotational: bool | None
    read_only: bool
    numa_node: int | None
    pcie: PcieLink | None
    queue: QueueLimits
    partitions: tuple[Partition, ...] = ()
    holders: tuple[str, ...] = ()
    slaves: tuple[str, ...] = ()
    backing_file: str | None = None
    signatures: tuple[Signature, ...] = ()
    in_use: tuple[UseReason, ...] = field(default=())
    fabric: Fabric | None = None  # NVMe over Fabrics: the paths, the subsystem, the link

    @property
    def transport_text(self) -> str:
        """nvme, or nvme-tcp (nvme-rdma, ...) for a namespace reached over a fabric."""
        return f"nvme-{self.fabric.transport}" if self.fabric else self.transport.value

    @property
    def busy(self) -> bool:
        return bool(self.in_use)


def _transport(name: str, syspath: str, props: dict[str, str]) -> Transport:
    prefixes = [
        ("loop", Transport.LOOP),
        ("md", Transport.MD),
        ("dm-", Transport.DM),
        ("zram", Transport.RAM),
        ("ram", Transport.RAM),
        ("nbd", Transport.NBD),
        ("nvme", Transport.NVME),
        ("mmcblk", Transport.MMC),
        ("vd", Transport.VIRTIO),
    ]
    for prefix, transport in prefixes:
        if name.startswith(prefix):
            return transport
    bus = props.get("ID_BUS", "")
    if "/usb" in syspath or bus == "usb":
        return Transport.USB
    if "/ata" in syspath or bus == "ata":
        return Transport.SATA
    if "/virtio" in syspath:
        return Transport.VIRTIO
    if "/host" in syspath or bus == "scsi":
        return Transport.SCSI
    return Transport.OTHER


def _clean(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return text or None


def _scheduler(text: str | None) -> str | None:
    if not text:
        return None
    m = re.search(r"\[([^\]]+)\]", text)
    return m.group(1) if m else text.split()[0]


def _pcie(tree: SysTree, base: str) -> PcieLink | None:
    """PCIe link of the PCI function behind a disk.

    A plain NVMe namespace's ``device`` is the controller and ``device/device`` its PCI
    function; a multipath head's ``device`` is the subsystem, whose controllers are its
    ``nvme*`` entries.
    """
    candidates = [f"{base}/device/device"]
    candidates += [
        f"{base}/device/{c}/device"
        for c in tree.listdir(f"{base}/device")
        if re.fullmatch(r"nvme\d+", c)
    ]
    candidates.append(f"{base}/device")
    for pci in candidates:
        speed = _clean(tree.read(f"{pci}/current_link_speed"))
        if speed is not None:
            return PcieLink(
                current_speed=speed,
                current_width=tree.read_int(f"{pci}/current_link_width"),
                max_speed=_clean(tree.read(f"{pci}/max_link_speed")),
                max_width=tree.read_int(f"{pci}/max_link_width"),
            )
    return None


def disk_numa(tree: SysTree, name: str) -> int | None:
    """The NUMA node of a whole disk's controller, None where the kernel does not say."""
    return _numa(tree, f"/sys/block/{name}")


def _numa(tree: SysTree, base: str) -> int | None:
    for rel in (f"{base}/device/numa_node", f"{base}/device/device/numa_node"):
        value = tree.read_int(rel)
        if value is not None:
            return value if value >= 0 else None
    return None


def _partitions(tree: SysTree, base: str, name: str) -> tuple[Partition, ...]:
    parts = []
    for entry in tree.listdir(base):
        if entry.startswith(name) and tree.exists(f"{base}/{entry}/partition"):
            parts.append(
                Partition(
                    name=entry,
                    devno=tree.read(f"{base}/{entry}/dev") or "",
                    size_bytes=(tree.read_int(f"{base}/{entry}/size") or 0) * SECTOR,
                    start_sector=tree.read_int(f"{base}/{entry}/start"),
                )
            )
    return tuple(parts)


def read_disk(host: Host, name: str) -> BlockDevice:
    """One disk's identity and geometry (no in-use analysis: see :func:`find_block_devices`)."""
    tree = host.tree
    base = f"/sys/block/{name}"
    props = host.udev_properties(name)
    syspath = tree.realpath(base)
    transport = _transport(name, syspath, props)
    partitions = _partitions(tree, base, name)
    holders = set(tree.listdir(f"{base}/holders"))
    for p in partitions:
        holders.update(tree.listdir(f"{base}/{p.name}/holders"))
    model = _clean(tree.read(f"{base}/device/model")) or _clean(props.get("ID_MODEL"))
    vendor = _clean(tree.read(f"{base}/device/vendor"))
    if model and vendor and transport in (Transport.SCSI, Transport.SATA, Transport.USB):
        model = f"{vendor} {model}"
    backing = _clean(tree.read(f"{base}/loop/backing_file"))
    if transport is Transport.MD:
        level = _clean(tree.read(f"{base}/md/level"))
        model = f"Linux md {level}" if level else "Linux md"
    if transport is Transport.DM:
        model = _clean(tree.read(f"{base}/dm/name"))
    rot = tree.read_int(f"{base}/queue/rotational")
    return BlockDevice(
        name=name,
        path=props.get("DEVNAME") or f"/dev/{name}",
        devno=tree.read(f"{base}/dev") or "",
        transport=transport,
        model=model,
        serial=_clean(tree.read(f"{base}/device/serial")) or _clean(props.get("ID_SERIAL_SHORT")),
        firmware=_clean(tree.read(f"{base}/device/firmware_rev"))
        or _clean(tree.read(f"{base}/device/rev"))
        or _clean(props.get("ID_REVISION")),
        size_bytes=(tree.read_int(f"{base}/size") or 0) * SECTOR,
        logical_block_size=tree.read_int(f"{base}/queue/logical_block_size"),
        physical_block_size=tree.read_int(f"{base}/queue/physical_block_size"),
        rotational=None if rot is None else bool(rot),
        read_only=tree.read_int(f"{base}/ro") == 1,
        numa_node=_numa(tree, base),
        pcie=_pcie(tree, base) if transport is Transport.NVME else None,
        queue=QueueLimits(
            max_sectors_kb=tree.read_int(f"{base}/queue/max_sectors_kb"),
            max_hw_sectors_kb=tree.read_int(f"{base}/queue/max_hw_sectors_kb"),
            nr_requests=tree.read_int(f"{base}/queue/nr_requests"),
            scheduler=_scheduler(tree.read(f"{base}/queue/scheduler")),
            minimum_io_size=tree.read_int(f"{base}/queue/minimum_io_size"),
            optimal_io_size=tree.read_int(f"{base}/queue/optimal_io_size"),
        ),
        partitions=partitions,
        holders=tuple(sorted(holders)),
        slaves=tuple(tree.listdir(f"{base}/slaves")),
        backing_file=backing,
        fabric=read_fabric(tree, name, host.route_iface) if transport is Transport.NVME else None,
    )


def _disks_under(devno: str, disks: dict[str, BlockDevice]) -> set[str]:
    """Physical disks behind a device number: a partition's disk, an md/dm's members, …"""
    found: set[str] = set()
    for d in disks.values():
        if d.devno == devno or any(p.devno == devno for p in d.partitions):
            if d.slaves:
                for s in d.slaves:
                    # a slave may be a partition (md on nvme0n1p1): map it to its disk
                    owner = next(
                        (
                            x
                            for x in disks.values()
                            if x.name == s or s in {p.name for p in x.partitions}
                        ),
                        None,
                    )
                    if owner is not None:
                        found |= _disks_under(owner.devno, disks) | {owner.name}
            found.add(d.name)
    return found


def _use_reasons(
    d: BlockDevice,
    mounts: Iterable[Mount],
    swaps: Iterable[str],
    system_disks: dict[str, set[str]],
    signatures: list[Signature],
    excl_error: str | None,
    exports: dict[str, list[str]],
) -> tuple[UseReason, ...]:
    reasons: list[UseReason] = []
    own = {d.devno: d.name} | {p.devno: p.name for p in d.partitions}
    names = set(own.values())
    for m in mounts:
        src = m.source.removeprefix("/dev/")
        if m.devno in own or src in names:
            who = own.get(m.devno, src)
            reasons.append(
                UseReason(Use.MOUNTED, f"{who} is mounted at {m.mountpoint} ({m.fstype})")
            )
    if d.partitions:
        listed = ", ".join(p.name for p in d.partitions)
        reasons.append(UseReason(Use.PARTITIONS, f"has partitions: {listed}"))
    for s in signatures:
        where = f"{s.type} signature on {s.device} at offset {s.offset}"
        reasons.append(UseReason(Use.SIGNATURE, where))
    if d.holders:
        reasons.append(UseReason(Use.HOLDERS, f"held by {', '.join(d.holders)}"))
    for swap in swaps:
        if swap.removeprefix("/dev/") in names:
            reasons.append(UseReason(Use.SWAP, f"{swap} is active swap"))
    for mountpoint, kind in (("/", Use.ROOT), ("/boot", Use.BOOT), ("/boot/efi", Use.BOOT)):
        if d.name in system_disks.get(mountpoint, set()):
            reasons.append(UseReason(kind, f"backs the {mountpoint} filesystem"))
    if excl_error:
        reasons.append(UseReason(Use.BUSY, f"cannot be opened exclusively (O_EXCL): {excl_error}"))
    for where in exports.get(d.name, []):
        reasons.append(
            UseReason(Use.EXPORTED, f"exported by this host's NVMe-oF target as {where}")
        )
    if d.fabric is not None and d.fabric.state != "live":
        paths = ", ".join(f"{p.controller} {p.state}" for p in d.fabric.paths)
        reasons.append(
            UseReason(
                Use.NOT_LIVE,
                f"no live path to nvme-{d.fabric.transport} {d.fabric.target} ({paths})",
            )
        )
    return tuple(reasons)


def _waits_on_a_lost_path(disks: dict[str, BlockDevice]) -> set[str]:
    """The disks whose reads would wait on an NVMe-oF namespace without a live path: the
    namespace itself, and every md or dm device over one (through its slaves, which may
    be partitions, and through the devices stacked in between)."""
    disk_of = {p.name: d.name for d in disks.values() for p in d.partitions}
    down = {n for n, d in disks.items() if d.fabric is not None and d.fabric.state != "live"}

    def waits(name: str, seen: frozenset[str]) -> bool:
        name = disk_of.get(name, name)
        if name in down:
            return True
        d = disks.get(name)
        return d is not None and name not in seen and any(waits(s, seen | {name}) for s in d.slaves)

    return {n for n in disks if waits(n, frozenset())}


def find_block_devices(host: Host, *, include_empty: bool = False) -> list[BlockDevice]:
    """Every whole disk of *host*, with every reason each one is in use.

    Disks of size 0 (unattached loop devices, empty optical drives) are left out unless
    *include_empty*; multipath per-path nodes (``hidden`` = 1) always are.
    """
    tree = host.tree
    disks: dict[str, BlockDevice] = {}
    for name in host.disk_names():
        if tree.read_int(f"/sys/block/{name}/hidden") == 1:
            continue
        d = read_disk(host, name)
        if d.size_bytes == 0 and not include_empty:
            continue
        disks[name] = d
    mounts = read_mounts(tree)
    swaps = read_swaps(tree)
    exports = target_exports(tree)
    system_disks: dict[str, set[str]] = {}
    for m in mounts:
        if m.mountpoint in ("/", "/boot", "/boot/efi"):
            system_disks.setdefault(m.mountpoint, set()).update(_disks_under(m.devno, disks))
            src = m.source.removeprefix("/dev/")
            if src in disks:
                system_disks[m.mountpoint].update(_disks_under(disks[src].devno, disks))
    result = []
    waits = _waits_on_a_lost_path(disks)
    for d in disks.values():
        sigs: list[Signature] = []
        excl: str | None = None
        # a namespace whose fabric has no live path queues every read until the link
        # comes back (minutes), and so does an array or a mapping over one: their
        # signatures and exclusive open are not probed
        down = d.name in waits
        if d.transport not in (Transport.RAM,) and d.size_bytes > 0 and not down:
            sigs = host.signatures(d.name)
            for p in d.partitions:
                sigs += host.signatures(p.name)
            excl = host.exclusive_open_error(d.name)
        reasons = _use_reasons(d, mounts, swaps, system_disks, sigs, excl, exports)
        result.append(replace(d, signatures=tuple(sigs), in_use=reasons))
    return result
