"""Probes for the raid layer: existing md arrays, their names, users and config entries, and
the facts a create is planned from (:func:`prepare_create`)."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from iotune import proc
from iotune.errors import UsageError
from iotune.probes.blockdev import BlockDevice, find_block_devices, read_disk
from iotune.probes.fabrics import lost_under
from iotune.probes.host import Host
from iotune.probes.mounts import read_mounts, read_swaps
from iotune.raid.model import ArrayInfo, HostSetup, Plan, RaidRequest, Step
from iotune.raid.plan import (
    ArrayFacts,
    Uuids,
    existing_members,
    matches_existing,
    pick_members,
    plan_create,
    plan_destroy,
)


def new_uuids() -> Uuids:
    h = uuid.uuid4().hex
    return Uuids(array=":".join(h[i : i + 8] for i in range(0, 32, 8)), fs=str(uuid.uuid4()))


def host_setup(root: Path = Path("/")) -> HostSetup:
    """Where this distribution keeps mdadm.conf, and how it rebuilds the initramfs."""
    conf = "/etc/mdadm/mdadm.conf" if (root / "etc/mdadm").is_dir() else "/etc/mdadm.conf"
    initramfs: tuple[str, ...] | None = None
    note = None
    if proc.which("update-initramfs"):
        initramfs = ("update-initramfs", "-u")
    elif proc.which("dracut"):
        initramfs = ("dracut", "--force")
    else:
        note = "no update-initramfs/dracut: the array is assembled after the initramfs, by udev"
    if initramfs and not os.access(root / "boot", os.W_OK):
        initramfs, note = None, "/boot is not writable: the initramfs was left as it is"
    return HostSetup(mdadm_conf=conf, fstab="/etc/fstab", initramfs=initramfs, initramfs_note=note)


def md_names() -> dict[str, str]:
    """md kernel name (md127) → array name, from the /dev/md/NAME links mdadm/udev create."""
    out = {}
    d = Path("/dev/md")
    if d.is_dir():
        for link in d.iterdir():
            out[Path(os.path.realpath(link)).name] = link.name
    return out


def named_array(host: Host, name: str) -> str:
    """Kernel name of the array called *name*; a usage error when there is none."""
    md = find_array(host, name)
    if md is None:
        raise UsageError(f"no md array named {name!r}", hint="'iotune raid status' lists them all")
    return md


def find_array(host: Host, name: str) -> str | None:
    """Kernel name of the array called *name* (/dev/md/NAME, or md/NAME in sysfs)."""
    link = Path("/dev/md") / name
    if link.exists():
        return Path(os.path.realpath(link)).name
    for md in host.tree.listdir("/sys/block"):
        if md.startswith("md") and md == name:
            return md
    return None


def _blkid(dev: str) -> dict[str, str]:
    done = proc.run(["blkid", "-p", "-o", "export", dev], check=False, timeout=30)
    out = {}
    for line in done.stdout.splitlines():
        k, _, v = line.partition("=")
        out[k] = v
    return out


def array_info(host: Host, md: str) -> ArrayInfo:
    t = host.tree
    base = f"/sys/block/{md}"
    names = md_names()
    members = []
    for s in t.listdir(f"{base}/slaves"):
        disk = s if t.exists(f"/sys/block/{s}") else None
        rec = read_disk(host, disk) if disk else None
        members.append(
            {
                "device": f"/dev/{s}",
                "model": rec.model if rec else None,
                "serial": rec.serial if rec else None,
                # md's view of the member: in_sync, faulty, spare, ...
                "state": t.read(f"{base}/md/dev-{s}/state"),
            }
        )
    devno = t.read(f"{base}/dev") or ""
    mine = [m for m in read_mounts(t) if m.devno == devno]
    mounts = [m.mountpoint for m in mine]
    name = names.get(md, md)
    # blkid reads the array: over a namespace without a live path that read would wait for
    # the controller's ctrl_loss_tmo (minutes); the mount table still names a mounted fs
    lost = lost_under(t, md)
    ident = _blkid(f"/dev/{md}") if lost is None else {"TYPE": mine[0].fstype} if mine else {}
    chunk = t.read_int(f"{base}/md/chunk_size")
    return ArrayInfo(
        name=name,
        device=f"/dev/md/{name}" if name != md else f"/dev/{md}",
        kernel_name=md,
        level=t.read(f"{base}/md/level"),
        chunk_bytes=chunk or None,
        state=t.read(f"{base}/md/array_state"),
        size_bytes=(t.read_int(f"{base}/size") or 0) * 512,
        members=members,
        fs=ident.get("TYPE"),
        fs_uuid=ident.get("UUID"),
        mountpoints=mounts,
        max_sectors_kb=t.read_int(f"{base}/queue/max_sectors_kb"),
        minimum_io_size=t.read_int(f"{base}/queue/minimum_io_size"),
        optimal_io_size=t.read_int(f"{base}/queue/optimal_io_size"),
        sync_action=t.read(f"{base}/md/sync_action"),
        sync_completed=t.read(f"{base}/md/sync_completed"),
        lost_path=lost,
    )


def list_arrays(host: Host) -> list[ArrayInfo]:
    return [
        array_info(host, md)
        for md in host.tree.listdir("/sys/block")
        if md.startswith("md") and host.tree.exists(f"/sys/block/{md}/md")
    ]


def open_files(paths: list[str], device: str) -> list[str]:
    """Processes holding a file under *paths* or the device itself open (/proc/*/fd)."""
    found = []
    real_dev = os.path.realpath(device)
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target == real_dev or any(
                target == p or target.startswith(p.rstrip("/") + "/") for p in paths
            ):
                found.append(f"pid {pid} ({comm}) has {target} open")
                break
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if any(cwd == p or cwd.startswith(p.rstrip("/") + "/") for p in paths):
            found.append(f"pid {pid} ({comm}) works in {cwd}")
    return found


def config_lines(path: str, needles: list[str]) -> list[tuple[str, str]]:
    try:
        text = Path(path).read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        if line.strip().startswith("#"):
            continue
        fields = line.split()
        if any(n in fields or any(f.endswith("=" + n) for f in fields) for n in needles):
            out.append((path, line))
    return out


def array_facts(host: Host, md: str, setup: HostSetup) -> ArrayFacts:
    info = array_info(host, md)
    t = host.tree
    swaps = {s.removeprefix("/dev/") for s in read_swaps(t)}
    mdadm_uuid = None
    done = proc.run(["mdadm", "--detail", "--export", f"/dev/{md}"], check=False, timeout=30)
    for line in done.stdout.splitlines():
        if line.startswith("MD_UUID="):
            mdadm_uuid = line.split("=", 1)[1]
    conf_needles = [info.device, f"/dev/{md}"] + ([mdadm_uuid] if mdadm_uuid else [])
    fstab_needles = [*info.mountpoints, info.device, f"/dev/{md}"]
    if info.fs_uuid:
        fstab_needles.append(info.fs_uuid)
    return ArrayFacts(
        name=info.name,
        device=info.device,
        kernel_name=md,
        members=tuple(m["device"] or "" for m in info.members),
        mountpoints=tuple(info.mountpoints),
        holders=tuple(t.listdir(f"/sys/block/{md}/holders")),
        open_by=tuple(open_files(info.mountpoints, f"/dev/{md}")),
        swap=md in swaps,
        conf_lines=tuple(config_lines(setup.mdadm_conf, conf_needles)),
        fstab_lines=tuple(config_lines(setup.fstab, fstab_needles)),
    )


@dataclass(frozen=True)
class Planned:
    """A create planned on this host, with every disk by name for describing the members."""

    plan: Plan
    disks: dict[str, BlockDevice]


def prepare_create(host: Host, req: RaidRequest) -> ArrayInfo | Planned:
    """The array of that name when it already is what *req* asks for (nothing to do), else
    the plan. An array of that name that differs, or a refused plan, raises before anything
    is touched."""
    disks = find_block_devices(host)
    by_name = {d.name: d for d in disks}
    md = find_array(host, req.name)
    if md:
        info = array_info(host, md)
        named = [host.disk_name(d) for d in req.devices] if req.devices else None
        if not matches_existing(info, req, named):
            raise UsageError(
                f"an array named {req.name!r} already exists ({info.level}, members "
                f"{', '.join(existing_members(info))}) and differs from this request",
                hint=f"pick another --name, or 'iotune raid destroy {req.name}' first",
            )
        return info
    names = [] if req.all_unused else [host.disk_name(d) for d in req.devices]
    chosen = pick_members(disks, req, names)
    mounted = [m.mountpoint for m in read_mounts(host.tree)]
    plan = plan_create(chosen, req, host_setup(), new_uuids(), mounted_paths=mounted)
    return Planned(plan, by_name)


def prepare_destroy(host: Host, name: str, *, wipe_members: bool) -> tuple[ArrayFacts, list[Step]]:
    """The facts about the array called *name* and the steps that remove it (refused while
    anything uses it)."""
    md = named_array(host, name)
    setup = host_setup()
    facts = array_facts(host, md, setup)
    return facts, plan_destroy(facts, wipe_members=wipe_members, setup=setup)
