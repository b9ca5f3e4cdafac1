"""The facts about a host that are not plain sysfs reads: udev properties, on-disk signatures,
exclusive opens and routes. :class:`LiveHost` asks the running system (pyudev, ``wipefs``,
``open(O_EXCL)``, ``ip route get``); :class:`RecordedHost` answers from a recorded tree's ``probes.json``.
Both resolve what a user types for a drive to its kernel name through their tree.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from iotune import proc
from iotune.errors import DeviceNotFound, ToolMissing, UsageError
from iotune.probes.sysfs import SysTree

PROBES_FILE = "probes.json"


@dataclass(frozen=True)
class Signature:
    """One on-disk signature as wipefs reports it (filesystem, RAID, LVM, partition table)."""

    device: str
    type: str
    offset: str
    uuid: str | None = None
    label: str | None = None


class Host:
    """Base: a sysfs tree plus the three non-sysfs probes."""

    def __init__(self, tree: SysTree) -> None:
        self.tree = tree

    def disk_names(self) -> list[str]:
        return self.tree.listdir("/sys/block")

    def disk_name(self, wanted: str) -> str:
        """The kernel name of the whole disk *wanted* names: ``nvme0n1``, ``/dev/nvme0n1`` or a
        link such as ``/dev/disk/by-id/...``. A partition or an unknown name is a usage error."""
        name = wanted.removeprefix("/dev/")
        # a relative name is looked up from the working directory, as a shell would
        path = os.path.abspath(wanted)
        if self.tree.is_link(path):
            name = PurePosixPath(self.tree.realpath(path)).name
        if not self.tree.is_dir(f"/sys/block/{name}"):
            if self.tree.exists(f"/sys/class/block/{name}/partition"):
                disk = PurePosixPath(self.tree.realpath(f"/sys/class/block/{name}")).parent.name
                raise UsageError(
                    f"{wanted} is a partition; iotune works on whole disks",
                    hint=f"ask for its disk: iotune devices /dev/{disk}",
                )
            raise DeviceNotFound(wanted)
        return name

    def udev_properties(self, name: str) -> dict[str, str]:
        raise NotImplementedError

    def signatures(self, name: str) -> list[Signature]:
        raise NotImplementedError

    def exclusive_open_error(self, name: str) -> str | None:
        """None if /dev/NAME opens with O_EXCL, else the reason it does not."""
        raise NotImplementedError

    def route_iface(self, address: str) -> str | None:
        """The network interface the route to *address* leaves by (NVMe-oF targets)."""
        return None


class LiveHost(Host):
    def __init__(self, tree: SysTree | None = None) -> None:
        super().__init__(tree or SysTree("/"))
        self._udev: dict[str, dict[str, str]] | None = None

    def _load_udev(self) -> dict[str, dict[str, str]]:
        if self._udev is None:
            import pyudev  # imported here: libudev is only needed on a live host

            ctx = pyudev.Context()
            self._udev = {
                dev.sys_name: {str(k): str(v) for k, v in dev.properties.items()}
                for dev in ctx.list_devices(subsystem="block")
            }
        return self._udev

    def disk_names(self) -> list[str]:
        # pyudev enumerates what udev/sysfs knows; whole disks only (DEVTYPE=disk)
        names = [n for n, p in self._load_udev().items() if p.get("DEVTYPE") == "disk"]
        return sorted(names)

    def udev_properties(self, name: str) -> dict[str, str]:
        return dict(self._load_udev().get(name, {}))

    def signatures(self, name: str) -> list[Signature]:
        done = proc.run(["wipefs", "--no-act", "--json", f"/dev/{name}"], check=False, timeout=30)
        if done.returncode != 0 or not done.stdout.strip():
            return []
        return parse_wipefs_json(done.stdout)

    def exclusive_open_error(self, name: str) -> str | None:
        try:
            fd = os.open(f"/dev/{name}", os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None  # no device node (e.g. in a container): nothing holds it
            return os.strerror(exc.errno or 0)
        os.close(fd)
        return None

    def route_iface(self, address: str) -> str | None:
        try:
            done = proc.run(["ip", "-j", "route", "get", address], check=False, timeout=10)
        except ToolMissing:  # no iproute2: the link is not named, nothing else changes
            return None
        return parse_route_json(done.stdout) if done.returncode == 0 else None


def parse_route_json(text: str) -> str | None:
    """``ip -j route get ADDR``'s interface: ``[{"dst": ..., "dev": "eth0", ...}]``."""
    try:
        routes = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(routes, list) and routes and isinstance(routes[0], dict):
        dev = routes[0].get("dev")
        return str(dev) if dev else None
    return None


class RecordedHost(Host):
    """A tree recorded from a real host by ``tests/tools/record_tree.py``."""

    def __init__(self, root: Path) -> None:
        super().__init__(SysTree(root))
        path = root / PROBES_FILE
        self._data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}

    def disk_names(self) -> list[str]:
        return sorted(self._data.get("disks", super().disk_names()))

    def udev_properties(self, name: str) -> dict[str, str]:
        return dict(self._data.get("udev", {}).get(name, {}))

    def signatures(self, name: str) -> list[Signature]:
        return [Signature(**s) for s in self._data.get("signatures", {}).get(name, [])]

    def exclusive_open_error(self, name: str) -> str | None:
        value = self._data.get("exclusive", {}).get(name)
        return str(value) if value else None

    def route_iface(self, address: str) -> str | None:
        value = self._data.get("routes", {}).get(address)
        return str(value) if value else None


def parse_wipefs_json(text: str) -> list[Signature]:
    data = json.loads(text)
    return [
        Signature(
            device=str(s.get("device", "")),
            type=str(s.get("type", "")),
            offset=str(s.get("offset", "")),
            uuid=s.get("uuid") or None,
            label=s.get("label") or None,
        )
        for s in data.get("signatures", [])
    ]
