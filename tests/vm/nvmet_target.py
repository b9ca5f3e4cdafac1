"""The kernel's own NVMe-oF target (nvmet) in the vm guest, through configfs, as its
documentation sets one up: a subsystem with one namespace per drive, open to any host, on a
TCP (or RDMA) port. RDMA runs over soft-RoCE:
``rxe`` puts the kernel's rdma_rxe on one end of a veth pair with ADDR, as blktests runs its
NVMe/RDMA tests on one machine. Run inside the guest:

    python nvmet_target.py up NQN ADDR PORT /dev/nvme1n1 /dev/nvme2n1
    python nvmet_target.py up-rdma NQN ADDR PORT /dev/nvme3n1
    python nvmet_target.py down NQN PORT
    python nvmet_target.py rxe ADDR | rxe-down
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CFG = Path("/sys/kernel/config")
NVMET = CFG / "nvmet"


def _write(path: Path, value: str) -> None:
    path.write_text(value)


#: the veth pair and the soft-RoCE device on its first end
VETH, PEER, RXE = "iotrxe0", "iotrxe1", "rxe0"


def rxe(addr: str) -> None:
    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True)

    subprocess.run(["modprobe", "rdma_rxe"], check=True)
    ip("link", "add", VETH, "type", "veth", "peer", "name", PEER)
    ip("addr", "add", f"{addr}/24", "dev", VETH)
    ip("link", "set", VETH, "up")
    ip("link", "set", PEER, "up")
    subprocess.run(["rdma", "link", "add", RXE, "type", "rxe", "netdev", VETH], check=True)


def rxe_down() -> None:
    subprocess.run(["rdma", "link", "delete", RXE], check=False)
    subprocess.run(["ip", "link", "del", VETH], check=False)


def up(nqn: str, addr: str, port: str, devices: list[str], trtype: str = "tcp") -> None:
    subprocess.run(["modprobe", "-a", "nvmet", f"nvmet-{trtype}", f"nvme-{trtype}"], check=True)
    if not NVMET.is_dir():
        subprocess.run(["mount", "-t", "configfs", "none", str(CFG)], check=True)
    sub = NVMET / "subsystems" / nqn
    sub.mkdir()
    _write(sub / "attr_allow_any_host", "1")
    for i, dev in enumerate(devices, 1):
        ns = sub / "namespaces" / str(i)
        ns.mkdir()
        _write(ns / "device_path", dev)
        _write(ns / "enable", "1")
    p = NVMET / "ports" / port
    p.mkdir()
    _write(p / "addr_trtype", trtype)
    _write(p / "addr_adrfam", "ipv4")
    _write(p / "addr_traddr", addr)
    _write(p / "addr_trsvcid", "4420")
    attach(nqn, port)


def attach(nqn: str, port: str) -> None:
    os.symlink(NVMET / "subsystems" / nqn, NVMET / "ports" / port / "subsystems" / nqn)


def down(nqn: str, port: str) -> None:
    link = NVMET / "ports" / port / "subsystems" / nqn
    if link.is_symlink():
        link.unlink()
    if (NVMET / "ports" / port).is_dir():
        (NVMET / "ports" / port).rmdir()
    sub = NVMET / "subsystems" / nqn
    for ns in sorted((sub / "namespaces").iterdir()) if sub.is_dir() else []:
        _write(ns / "enable", "0")
        ns.rmdir()
    if sub.is_dir():
        sub.rmdir()


def main() -> None:
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "up":
        up(args[0], args[1], args[2], args[3:])
    elif cmd == "up-rdma":
        up(args[0], args[1], args[2], args[3:], trtype="rdma")
    elif cmd == "rxe":
        rxe(args[0])
    elif cmd == "rxe-down":
        rxe_down()
    elif cmd == "down":
        down(args[0], args[1])
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
