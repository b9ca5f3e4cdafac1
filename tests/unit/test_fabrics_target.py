"""Where a fabrics target is, as users write it, and which subsystem to connect there."""

from __future__ import annotations

import pytest

from iotune.errors import UsageError
from iotune.fabrics.target import Offer, Target, choose_nqn, parse_discovery, parse_target

pytestmark = pytest.mark.unit

NQN = "nqn.2026-11.io.iotune:fabric"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("tcp://10.0.0.2:4420", Target("tcp", "10.0.0.2", "4420")),
        ("tcp://10.0.0.2", Target("tcp", "10.0.0.2", "4420")),
        ("rdma://192.168.1.7:4421", Target("rdma", "192.168.1.7", "4421")),
        ("tcp://[fe80::1]:4420", Target("tcp", "fe80::1", "4420")),
        ("tcp://[fd00::2]", Target("tcp", "fd00::2", "4420")),
        ("tcp://flash-a.example", Target("tcp", "flash-a.example", "4420")),
        ("loop", Target("loop")),
    ],
)
def test_a_target_as_users_write_it(text: str, want: Target) -> None:
    assert parse_target(text) == want


def test_a_target_is_given_back_as_nvme_cli_takes_it() -> None:
    t = parse_target("tcp://[fd00::2]:4430")
    assert t.text() == "tcp://[fd00::2]:4430" and t.module == "nvme-tcp"
    assert t.nvme_args() == ["-t", "tcp", "-a", "fd00::2", "-s", "4430"]
    assert Target("loop").nvme_args() == ["-t", "loop"] and Target("loop").module == "nvme-loop"


@pytest.mark.parametrize(
    ("text", "message", "hint"),
    [
        ("10.0.0.2", "'10.0.0.2' is not a fabrics target", "TRANSPORT://ADDRESS[:PORT]"),
        ("iscsi://10.0.0.2", "unknown transport 'iscsi'", "fc, loop, rdma, tcp"),
        ("tcp://fe80::1", "an IPv6 address goes in brackets", "tcp://[fe80::1]:4420"),
        ("tcp://10.0.0.2:70000", "port '70000' is not a port", "tcp://10.0.0.2:4420"),
        ("tcp://:4420", "names no address", "tcp://"),
        ("tcp://a b:4420", "'a b' is not an address", "tcp://"),
        ("loop://x", "the loop transport has no address", "'loop'"),
    ],
)
def test_a_target_that_is_not_one_is_one_line(text: str, message: str, hint: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_target(text)
    assert message in e.value.message and hint in (e.value.hint or ""), (
        e.value.message,
        e.value.hint,
    )


#: ``nvme discover -o json`` (nvme-cli 2.3) against the kernel's target (nvmet) on 6.1
DISCOVERY = {
    "genctr": 3,
    "records": [
        {"trtype": "tcp", "adrfam": "ipv4", "subtype": "current discovery subsystem",
         "treq": "not specified, sq flow control disable supported", "portid": 1,
         "trsvcid": "4420", "subnqn": "nqn.2014-08.org.nvmexpress.discovery",
         "traddr": "127.0.0.1", "eflags": "none", "sectype": "none"},
        {"trtype": "tcp", "adrfam": "ipv4", "subtype": "nvme subsystem",
         "treq": "not specified, sq flow control disable supported", "portid": 1,
         "trsvcid": "4420", "subnqn": NQN, "traddr": "127.0.0.1", "eflags": "none",
         "sectype": "none"},
    ],
}  # fmt: skip


def test_the_subsystem_is_the_one_asked_for_or_the_only_one_offered() -> None:
    offers = parse_discovery(DISCOVERY)
    assert [o.discovery for o in offers] == [True, False]
    assert offers[1] == Offer(NQN, "tcp", "127.0.0.1", "4420", "nvme subsystem")
    t = Target("tcp", "127.0.0.1", "4420")
    assert choose_nqn(t, offers, None) == NQN
    assert choose_nqn(t, offers, NQN) == NQN
    with pytest.raises(UsageError) as e:
        choose_nqn(t, offers, "nqn.2026-11.io.iotune:other")
    assert e.value.message == (
        f"tcp://127.0.0.1:4420 offers no subsystem nqn.2026-11.io.iotune:other (it offers {NQN})"
    )
    assert e.value.hint == f"--nqn {NQN}"
    two = [*offers, Offer("nqn.b", "tcp", "127.0.0.1", "4420", "nvme subsystem")]
    with pytest.raises(UsageError, match=f"offers 2 subsystems: {NQN}, nqn.b"):
        choose_nqn(t, two, None)
    with pytest.raises(UsageError, match=r"offers no subsystem$"):
        choose_nqn(t, offers[:1], None)


# ------------------------------------------------------------- NVMe over FC: the host's port

TGT_FC = "nn-0x20000090fa942779:pn-0x10000090fa942779"
HOST_FC = "nn-0x20000090fa94277a:pn-0x10000090fa94277a"


def test_fc_takes_the_hosts_port_and_gives_both_to_nvme_cli() -> None:
    """The kernel's nvme-fc requires host_traddr (drivers/nvme/host/fc.c: required_opts
    NVMF_OPT_TRADDR | NVMF_OPT_HOST_TRADDR): nvme-cli's --host-traddr (-w)."""
    t = parse_target(
        f"fc://{TGT_FC.upper().replace('NN-0X', 'nn-0x').replace('PN-0X', 'pn-0x')}", HOST_FC
    )
    assert t == Target("fc", TGT_FC, None, HOST_FC)
    assert t.nvme_args() == ["-t", "fc", "-a", TGT_FC, "-w", HOST_FC]
    assert t.text() == f"fc://{TGT_FC}"
    # the kernel's other form, without 0x, is the same port
    short = "nn-20000090fa942779:pn-10000090fa942779"
    assert parse_target(f"fc://{short}", HOST_FC.replace("-0x", "-")) == t
    # TCP and RDMA: the source address, optional
    tcp = parse_target("tcp://10.0.0.2", "10.0.0.1")
    assert tcp.nvme_args() == ["-t", "tcp", "-a", "10.0.0.2", "-s", "4420", "-w", "10.0.0.1"]
    assert parse_target("tcp://10.0.0.2").nvme_args() == [
        "-t",
        "tcp",
        "-a",
        "10.0.0.2",
        "-s",
        "4420",
    ]


@pytest.mark.parametrize(
    ("text", "host", "message", "hint"),
    [
        (f"fc://{TGT_FC}", None, f"fc://{TGT_FC} needs --host-traddr", "--host-traddr " + HOST_FC),
        ("fc://20000090fa942779", HOST_FC, "is not an FC port", "nn-0x"),
        (f"fc://{TGT_FC}", "10.0.0.1", "--host-traddr '10.0.0.1' is not an FC port", "nn-0x"),
        ("tcp://10.0.0.2", HOST_FC, f"--host-traddr {HOST_FC!r} is not an IP address", "10.0.0.1"),
        ("loop", "10.0.0.1", "the loop transport takes no --host-traddr", "leave it out"),
        ("tcp://10.010.0.2", None, "leading zeros", "tcp://10.10.0.2:4420"),
        ("tcp://10.0.0.2", "10.000.0.1", "leading zeros", "--host-traddr 10.0.0.1"),
    ],
)
def test_a_host_address_that_is_not_one_is_one_line(
    text: str, host: str | None, message: str, hint: str
) -> None:
    with pytest.raises(UsageError) as e:
        parse_target(text, host, fc_ports=[HOST_FC])
    assert message in e.value.message and hint in (e.value.hint or ""), (
        e.value.message,
        e.value.hint,
    )


def test_an_fc_target_without_the_hosts_port_names_this_hosts_ports() -> None:
    with pytest.raises(UsageError) as e:
        parse_target(f"fc://{TGT_FC}", fc_ports=[HOST_FC, "nn-0x1:pn-0x2"])
    assert e.value.hint is not None and HOST_FC in e.value.hint and "nn-0x1" in e.value.hint
    with pytest.raises(UsageError) as e:
        parse_target(f"fc://{TGT_FC}")
    assert e.value.hint is not None and "/sys/class/fc_host" in e.value.hint
