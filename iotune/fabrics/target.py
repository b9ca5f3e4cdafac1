"""Where an NVMe over Fabrics target is, as a user names it: ``tcp://10.0.0.2:4420``,
``rdma://[fe80::1]:4420``, ``loop``; and what ``nvme discover -o json`` says it offers. Pure."""

from __future__ import annotations

import ipaddress
import re
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


@dataclass(frozen=True)
class Target:
    transport: str
    traddr: str | None = None
    trsvcid: str | None = None

    @property
    def module(self) -> str:
        return MODULES[self.transport]

    def text(self) -> str:
        if self.traddr is None:
            return self.transport
        host = f"[{self.traddr}]" if ":" in self.traddr else self.traddr
        return f"{self.transport}://{host}:{self.trsvcid}"

    def nvme_args(self) -> list[str]:
        """The target as nvme-cli takes it."""
        out = ["-t", self.transport]
        if self.traddr is not None:
            out += ["-a", self.traddr]
        if self.trsvcid is not None:
            out += ["-s", self.trsvcid]
        return out


def parse_target(text: str) -> Target:
    """``TRANSPORT://ADDRESS[:PORT]`` (IPv6 in brackets), or ``loop``; fc takes the target's
    ``nn-0x...:pn-0x...`` as its address."""
    t = text.strip()
    if t == "loop":
        return Target("loop")
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
        return Target("fc", rest)
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
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        if not re.fullmatch(r"[A-Za-z0-9.-]+", addr):
            raise UsageError(f"{text!r}: {addr!r} is not an address", hint=EXAMPLE) from None
    return Target(transport, addr, port or DEFAULT_PORT)


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
