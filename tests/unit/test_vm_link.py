"""The vm tier's own set-up, where its threads meet (tests/vm/conftest.py): kept out of the
mutation tester's selection, whose copy of the tree has no vm tier."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_the_vm_tiers_two_guests_are_given_one_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session guest's set-up and the lab's ask for the link at once, from two threads:
    each once bound its socket in a folder of its own and sent to the other's socket in its
    own folder, so no frame crossed and the fabric's runs found the target unreachable. Any
    number of threads asking at once get one link, in one folder."""
    import tempfile
    import threading

    import tests.vm.conftest as vm

    monkeypatch.setattr(vm, "_links", [])
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    start = threading.Barrier(8)
    got = []

    def ask() -> None:
        start.wait()
        got.append(vm.link())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(x is got[0] for x in got)
    assert [p.name for p in tmp_path.iterdir()] == [got[0].folder.name]


def test_a_guest_reads_the_tsc_only_where_the_host_does(tmp_path: Path) -> None:
    """tests/vm/guest.py clock_options: the TSC for the guest where the host's own clock is
    the TSC; the guest's own choice where the host's is another, or cannot be read."""
    from tests.vm.guest import clock_options

    (tmp_path / "current_clocksource").write_text("tsc\n")
    assert clock_options(tmp_path) == ("clocksource=tsc", "tsc=reliable")
    (tmp_path / "current_clocksource").write_text("hpet\n")
    assert clock_options(tmp_path) == ()
    assert clock_options(tmp_path / "none") == ()
