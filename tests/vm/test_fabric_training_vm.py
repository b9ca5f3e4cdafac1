"""NVMe over TCP across a network under the real programs' training path, in the study's lab
once its study is done (tests/vm/fabric_lab.py): two namespaces of the other guest's nvmet-tcp
target, seen across the virtual link between the two; a RAID0 over them, `iotune sweep-aio`
on it with the study model's swapping, `iotune trace --run tiny_opt_nvme` on it, exact to the
model summed over the namespaces, and a run whose network goes away once it has
initialised, stopped with the namespace named."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.vm.conftest import Session
from tests.vm.fabric_lab import ADDR, FAB_SERIALS, FAB_STEPS, NQN, FabricRuns
from tests.vm.study_lab import SETS

#: what writes move beyond DeepSpeed's files: xfs's log and metadata (tens of KiB a step)
FS_WRITES = 1024 * 1024


def _run_doc(fabric_runs: FabricRuns) -> dict[str, Any]:
    doc = fabric_runs.run
    assert doc["steps_done"] == FAB_STEPS, doc.get("error")
    return doc


def test_the_namespaces_come_from_the_other_guest_across_the_link(
    fabric_runs: FabricRuns, vm: Session
) -> None:
    """Two hosts on one wire: the lab sees each namespace over TCP from the other guest's
    address, live, through its NIC at the speed the NIC reports; on the other guest, the
    drives behind them are in use, exported by its target."""
    for d in fabric_runs.devices["devices"]:
        f = d["fabric"]
        assert d["name"] in fabric_runs.namespaces, d
        assert (f["transport"], f["nqn"], f["state"]) == ("tcp", NQN, "live"), f
        assert f["target"] == f"{ADDR}:4420" and len(f["paths"]) == 1, f
        assert (f["iface"], f["link_mbps"]) == (fabric_runs.iface, 10000), f
    exported = vm.iotune_json("devices", "--all", *(vm.dev(s) for s in FAB_SERIALS))
    backing = {d["name"]: d for d in exported["devices"]}
    for i, serial in enumerate(FAB_SERIALS, 1):
        d = backing[vm.dev(serial).removeprefix("/dev/")]
        assert {
            "kind": "exported",
            "detail": f"exported by this host's NVMe-oF target as {NQN} namespace {i}",
        } in d["in_use"], d["in_use"]


def test_a_raid0_over_two_tcp_namespaces_is_built_and_swept_with_the_models_swapping(
    fabric_runs: FabricRuns,
) -> None:
    created, sweep = fabric_runs.created, fabric_runs.sweep
    assert created["applied"] is True and created["array"]["level"] == "raid0", created
    array = created["array"]
    members = sorted(m["device"].rsplit("/", 1)[-1] for m in array["members"])
    assert members == fabric_runs.namespaces, (members, fabric_runs.namespaces)
    assert array["mountpoints"] == ["/tmp/fab"] and array["fs"] == "xfs", array
    assert sweep["ok"] >= 2 and sweep["failed"] == 0, sweep
    assert {c["op"] for c in sweep["ceilings"] if c.get("bw_bytes_s")} == {"read", "write"}
    swap = sweep["swap"]
    assert swap["status"] == "ok" and swap["sets"] == list(SETS), swap
    # the rehearsal swapped the files of the run below, to DeepSpeed's padding
    want = _run_doc(fabric_runs)["estimate"]["steady_step"]["read"]
    assert abs(swap["read_bytes"] - want) <= 0.01 * want, (swap["read_bytes"], want)
    assert swap["read_bw_bytes_s"] > 0 and swap["write_bw_bytes_s"] > 0, swap


def test_training_on_the_fabric_raid0_moves_the_model_on_each_namespace(
    fabric_runs: FabricRuns,
) -> None:
    """Each steady step's requests land on the two namespaces (md is bio-based): reads the
    model's to the byte, writes up to the file system's own beyond it, each namespace within
    5% of half; and the trace agrees with each namespace's own counters."""
    doc = _run_doc(fabric_runs)
    members = sorted(doc["drives"])
    assert members == fabric_runs.namespaces, members
    est = doc["estimate"]["steady_step"]
    steady = doc["io_steps"][2:]  # init, the first step, then the steady one
    assert steady, doc["io_steps"]
    for step in steady:
        per = step["drives"]
        rd = sum(per[m]["read"] for m in members)
        wr = sum(per[m]["write"] for m in members)
        assert rd == est["read"], (step["label"], rd, est["read"])
        assert 0 <= wr - est["write"] <= FS_WRITES, (step["label"], wr, est["write"])
        for m in members:
            for op, total in (("read", rd), ("write", wr)):
                half = total / 2
                assert abs(per[m][op] - half) <= 0.05 * half + (total - est[op]), (m, op, per)
    trace = json.loads((fabric_runs.run_out / "trace.json").read_text())
    for d in trace["devices"]:
        if d["name"] in members:
            chk = d["check"]
            assert chk["exact"] or chk["summary"].startswith("consistent: "), (d["name"], chk)


def test_a_path_lost_under_training_stops_the_run_and_names_the_namespace(
    fabric_runs: FabricRuns,
) -> None:
    """The lab's end of the link taken down once the run has initialised: the run's
    swapping would wait on the namespaces until ctrl_loss_tmo (600 s); the trace stops the
    training after its grace (10 s), in one line naming the namespace and what it lost, and
    keeps the records made until then. `devices` shows both namespaces without a live path,
    `raid status` the array's lost namespace (its file system from the mount table: blkid's
    read would wait), and `raid create` refuses them, as a training run and a sweep on the
    array are refused. The run's result is written (run.json, with the loss in
    it) and its swap files are left where they are (removing them would wait on the lost
    path too), the error's hint says where. Meanwhile a sync(2) waits on the lost namespaces'
    file system, and a run's write-back of its own does not: the checkpoint runs beside go
    on (their start writes back their drives' file systems only)."""
    lost, out = fabric_runs.lost, fabric_runs.lost_out
    assert lost["rc"] == 1, lost["stderr"]
    assert "Traceback" not in lost["stderr"], lost["stderr"]
    (line,) = [x for x in lost["stderr"].splitlines() if x.startswith("iotune: error:")]
    names = "|".join(map(re.escape, fabric_runs.namespaces))
    assert re.fullmatch(
        rf"iotune: error: stopped: ({names}) lost its path to nvme-tcp "
        rf"{re.escape(ADDR)}:4420: (connecting|resetting) for 1\d s; records kept in "
        + re.escape(str(out)),
        line,
    ), line
    # the keep-alive's timeout (the host's controller sees the link gone: 5 s), the grace,
    # a tick, the worker's stop (SIGTERM, then SIGKILL) and the records written
    assert 10 <= lost["after_s"] <= 60, lost
    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x]
    assert any(r["event"] == "init" for r in steps), steps
    doc = json.loads((out / "run.json").read_text())
    assert doc["lost_path"] and line.startswith(f"iotune: error: stopped: {doc['lost_path']};")
    assert doc["steps_done"] < 50 and doc["swap_dirs"], doc
    (hint,) = [x for x in lost["stderr"].splitlines() if x.startswith("hint:")]
    assert hint.endswith(f"; the swap files are left in {', '.join(doc['swap_dirs'])}"), hint
    assert lost["sync_held"] is True and lost["write_back_s"] < 5, lost
    for d in fabric_runs.lost_devices["devices"]:
        assert d["fabric"]["state"] in ("connecting", "resetting"), d["fabric"]
        assert any(r["kind"] == "not live" for r in d["in_use"]), d["in_use"]
    (array,) = fabric_runs.lost_status["arrays"]
    assert array["lost_path"] in fabric_runs.namespaces and array["fs"] == "xfs", array
    assert array["mountpoints"] == ["/tmp/fab"], array
    no = fabric_runs.refused
    assert no["rc"] == 1 and "refusing to build /dev/md/gone" in no["stderr"], no
    assert f"no live path to nvme-tcp {ADDR}:4420" in no["stderr"], no
    # a run and a sweep on the array then: one line naming the namespace, at once (their
    # first write there would have waited for ctrl_loss_tmo)
    for name, what in (("run", "offload directory"), ("sweep", "target")):
        r = no[name]
        (line,) = [x for x in r["stderr"].splitlines() if x.startswith("iotune: error:")]
        assert r["rc"] == 1 and re.fullmatch(
            rf"iotune: error: {what} /tmp/fab is on ({names}), which has no live path to "
            rf"nvme-tcp {re.escape(ADDR)}:4420 \((connecting|resetting)\): its reads and "
            r"writes would wait for the controller's ctrl_loss_tmo",
            line,
        ), (name, r)
        # at once: in the time the same command takes to refuse a directory that does not
        # exist (the check before), not the 600 s of a write waiting on the lost path
        assert "Traceback" not in r["stderr"], (name, r)
        base = r["base"]
        assert base["rc"] == 2 and "/tmp/fab-none does not exist" in base["stderr"], base
        assert r["s"] < 2 * base["s"] + 10, (name, r)
