"""Where an NVMe over Fabrics target is, as a user names it: ``tcp://10.0.0.2:4420``,
``rdma://[fe80::1]:4420``, ``fc://nn-0x...:pn-0x...`` (with the host's own FC port), ``loop``;
an address as the kernel reads it, so that two spellings of one place compare equal; and what
``nvme discover -o json`` says it offers. Pure."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from iotune.errors import UsageError
from iotune.probes.fabrics import MODULES

#: the port NVMe over Fabrics listens on by default (the I/O controllers' and discovery's)
DEFAULT_PORT = "4420"
#: the kernel option that builds each transport's host module
CONFIG = {
    "tcp": "CONFIG_NVME_TCP",
    "rdma": "CONFIG_NVME_RDMA",
    "fc": "CONFIG_NVME_FC",
    "loop": "CONFIG_NVME_TARGET_LOOP",
}
#: in the subsystem type of a discovery controller's own records ("current discovery
#: subsystem", "discovery subsystem referral")
DISCOVERY = "discovery subsystem"
NO_SUBSYSTEM_HINT = (
    "export a subsystem on the target's port first (nvmet: its port's subsystems/ folder)"
)
EXAMPLE = "tcp://10.0.0.2:4420"
#: an FC port as nvme-fc reads it (drivers/nvme/host/fc.c nvme_fc_parse_traddr): the node's
#: and the port's world-wide names, 16 hex digits each, with or without 0x
FC_PORT = re.compile(r"nn-(?:0x)?([0-9a-f]{16}):pn-(?:0x)?([0-9a-f]{16})", re.IGNORECASE)
FC_EXAMPLE = "nn-0x20000090fa942779:pn-0x10000090fa942779"
FC_PORT_TEXT = "nn-0x<WWNN>:pn-0x<WWPN> (16 hex digits each)"


@dataclass(frozen=True)
class Target:
    transport: str
    traddr: str | None = None
    trsvcid: str | None = None
    #: the host's side: FC's own port (nvme-fc requires it), or TCP's/RDMA's source address
    host_traddr: str | None = None

    @property
    def module(self) -> str:
        return MODULES[self.transport]

    def text(self) -> str:
        if self.traddr is None:
            return self.transport
        if self.trsvcid is None:  # fc: its address has colons and no port
            return f"{self.transport}://{self.traddr}"
        host = f"[{self.traddr}]" if ":" in self.traddr else self.traddr
        return f"{self.transport}://{host}:{self.trsvcid}"

    def nvme_args(self) -> list[str]:
        """The target as nvme-cli takes it (``discover`` and ``connect`` alike)."""
        out = ["-t", self.transport]
        if self.traddr is not None:
            out += ["-a", self.traddr]
        if self.trsvcid is not None:
            out += ["-s", self.trsvcid]
        if self.host_traddr is not None:
            out += ["-w", self.host_traddr]
        return out


def fc_port(text: str) -> tuple[int, int] | None:
    """An FC port's (WWNN, WWPN), or None for what nvme-fc would not read as one."""
    m = FC_PORT.fullmatch(text.strip())
    return (int(m.group(1), 16), int(m.group(2), 16)) if m else None


def fc_text(port: tuple[int, int]) -> str:
    return f"nn-0x{port[0]:016x}:pn-0x{port[1]:016x}"


def _kernel_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """A dotted quad as the kernel's in4_pton reads it: each part decimal, leading zeros
    and all (Python's ipaddress refuses leading zeros; inet_aton would read them octal)."""
    parts = text.split(".")
    if len(parts) != 4 or not all(p.isdigit() and len(p) <= 3 for p in parts):
        return None
    octets = [int(p) for p in parts]
    if any(o > 255 for o in octets):
        return None
    return ipaddress.IPv4Address(".".join(map(str, octets)))


def ip_of(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An IPv4 or IPv6 address (any spelling: ``0:0::1`` is ``::1``, ``10.000.0.1`` is
    ``10.0.0.1``), or None for a host name or anything else."""
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return _kernel_ipv4(text.strip())


def address_key(transport: str, traddr: str | None) -> object:
    """What two spellings of one address have in common, as the kernel reads it: an FC
    port's two names as numbers, an IP address as one, a host name in lower case."""
    if traddr is None:
        return None
    if transport == "fc" and (port := fc_port(traddr)) is not None:
        return port
    ip = ip_of(traddr)
    return ip if ip is not None else traddr.strip().lower()


def port_key(trsvcid: str | None) -> object:
    """A port number as a number (``04420`` is ``4420``); none is the default port."""
    text = (trsvcid or DEFAULT_PORT).strip()
    return int(text) if text.isdigit() else text


def _leading_zeros(text: str, what: str, written: str) -> UsageError | None:
    """A dotted quad with leading zeros: the kernel reads them decimal, the resolver's
    inet_aton octal (010 is 10 to one, 8 to the other), so which host is meant is unsure."""
    ip = _kernel_ipv4(text)
    if ip is None or str(ip) == text:
        return None
    return UsageError(
        f"{what}: {text!r} has leading zeros, which the kernel reads as decimal and the "
        "resolver as octal",
        hint=f"write it without them: {written.replace(text, str(ip))}",
    )


def _host_traddr(transport: str, host_traddr: str | None, fc_ports: Sequence[str]) -> str | None:
    """The host's side of a connection, checked: FC needs this host's port (nvme-fc requires
    host_traddr: drivers/nvme/host/fc.c required_opts); TCP and RDMA take a source address."""
    if host_traddr is None:
        return None
    h = host_traddr.strip()
    if transport == "loop":
        raise UsageError("the loop transport takes no --host-traddr", hint="leave it out")
    if transport == "fc":
        port = fc_port(h)
        if port is None:
            raise UsageError(
                f"--host-traddr {h!r} is not an FC port: {FC_PORT_TEXT}",
                hint=_fc_ports_hint(fc_ports),
            )
        return fc_text(port)
    bad = _leading_zeros(h, f"--host-traddr {h}", f"--host-traddr {h}")
    if bad is not None:
        raise bad
    try:
        ipaddress.ip_address(h)
    except ValueError:
        raise UsageError(
            f"--host-traddr {h!r} is not an IP address ({transport}: the address to connect from)",
            hint="e.g. --host-traddr 10.0.0.1, or --host-iface eth1 for tcp",
        ) from None
    return h


def _fc_ports_hint(fc_ports: Sequence[str]) -> str:
    if fc_ports:
        return "this host's FC ports: " + ", ".join(f"--host-traddr {p}" for p in fc_ports)
    return (
        "--host-traddr nn-0x<WWNN>:pn-0x<WWPN> of this host's FC port "
        "(/sys/class/fc_host/host*/node_name and port_name)"
    )


def parse_target(text: str, host_traddr: str | None = None, fc_ports: Sequence[str] = ()) -> Target:
    """``TRANSPORT://ADDRESS[:PORT]`` (IPv6 in brackets), or ``loop``; fc takes the target's
    ``nn-0x...:pn-0x...`` as its address and needs *host_traddr*, this host's FC port
    (*fc_ports*: those it has, named in the hint); TCP and RDMA may name a source address."""
    t = text.strip()
    if t == "loop":
        return Target("loop", host_traddr=_host_traddr("loop", host_traddr, fc_ports))
    m = re.fullmatch(r"([a-z]+)://(.+)", t)
    if not m:
        raise UsageError(
            f"{text!r} is not a fabrics target",
            hint=f"TRANSPORT://ADDRESS[:PORT], e.g. {EXAMPLE} (or 'loop')",
        )
    transport, rest = m.groups()
    if transport not in MODULES:
        raise UsageError(
            f"unknown transport {transport!r} in {text!r}",
            hint="one of " + ", ".join(sorted(MODULES)),
        )
    if transport == "loop":
        raise UsageError("the loop transport has no address", hint="write it as 'loop'")
    if transport == "fc":
        wwn = fc_port(rest)
        if wwn is None:
            raise UsageError(
                f"{text!r}: {rest!r} is not an FC port: {FC_PORT_TEXT}",
                hint=f"fc://{FC_EXAMPLE}",
            )
        target = f"fc://{fc_text(wwn)}"
        if host_traddr is None:
            raise UsageError(
                f"{target} needs --host-traddr: nvme-fc connects from one of this host's FC "
                "ports, named by its WWNN and WWPN",
                hint=_fc_ports_hint(fc_ports),
            )
        return Target("fc", fc_text(wwn), None, _host_traddr("fc", host_traddr, fc_ports))
    six = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", rest)
    if six:
        addr, port = six.group(1), six.group(2)
    else:
        addr, _, port = rest.partition(":") if rest.count(":") == 1 else (rest, "", "")
        if rest.count(":") > 1:
            raise UsageError(
                f"{text!r}: an IPv6 address goes in brackets",
                hint=f"{transport}://[{rest}]:{DEFAULT_PORT}",
            )
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise UsageError(f"{text!r}: port {port!r} is not a port", hint=EXAMPLE)
    if not addr:
        raise UsageError(f"{text!r} names no address", hint=EXAMPLE)
    bad = _leading_zeros(addr, repr(text), f"{transport}://{addr}:{port or DEFAULT_PORT}")
    if bad is not None:
        raise bad
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9.-]+", addr):
            raise UsageError(f"{text!r}: {addr!r} is not an address", hint=EXAMPLE) from None
    host = _host_traddr(transport, host_traddr, fc_ports)
    return Target(transport, addr, port or DEFAULT_PORT, host)


@dataclass(frozen=True)
class Offer:
    """One record of a discovery log: a subsystem the target offers, and where."""

    nqn: str
    transport: str
    traddr: str | None
    trsvcid: str | None
    subtype: str

    @property
    def discovery(self) -> bool:
        return DISCOVERY in self.subtype


def parse_discovery(doc: dict[str, Any]) -> list[Offer]:
    """``nvme discover -o json``'s records (nvme-cli 2: ``{"records": [...]}``)."""
    out = []
    for r in doc.get("records") or []:
        out.append(
            Offer(
                nqn=str(r.get("subnqn", "")),
                transport=str(r.get("trtype", "")),
                traddr=r.get("traddr"),
                trsvcid=str(r["trsvcid"]) if r.get("trsvcid") not in (None, "") else None,
                subtype=str(r.get("subtype", "")),
            )
        )
    return out


def choose_nqn(target: Target, offers: list[Offer], nqn: str | None) -> str:
    """The subsystem to connect: the one asked for, which the target must offer, or the only
    one it offers."""
    subsystems = sorted({o.nqn for o in offers if not o.discovery and o.nqn})
    where = target.text()
    if nqn is not None:
        if nqn in subsystems:
            return nqn
        raise UsageError(
            f"{where} offers no subsystem {nqn}"
            + (f" (it offers {', '.join(subsystems)})" if subsystems else " (it offers none)"),
            hint=(
                f"--nqn {subsystems[0]}"
                if len(subsystems) == 1
                else "--nqn one of those"
                if subsystems
                else NO_SUBSYSTEM_HINT
            ),
        )
    if len(subsystems) == 1:
        return subsystems[0]
    if not subsystems:
        raise UsageError(f"{where} offers no subsystem", hint=NO_SUBSYSTEM_HINT)
    raise UsageError(
        f"{where} offers {len(subsystems)} subsystems: {', '.join(subsystems)}",
        hint="--nqn names the one to connect",
    )
