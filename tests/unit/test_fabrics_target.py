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
        (
            "fc://nn-0x20000090fa942779:pn-0x10000090fa942779",
            Target("fc", "nn-0x20000090fa942779:pn-0x10000090fa942779"),
        ),
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
