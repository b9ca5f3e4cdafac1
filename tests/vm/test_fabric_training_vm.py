"""NVMe over TCP under the real programs' training path, in the study's lab once its study is
done (tests/vm/fabric_lab.py): a RAID0 over two namespaces of the guest's own nvmet-tcp
target, `iotune sweep-aio` on it with the study model's swapping, `iotune trace --run
tiny_opt_nvme` on it, exact to the model summed over the namespaces."""

from __future__ import annotations

import json
from typing import Any

from tests.vm.fabric_lab import FAB_STEPS, FabricRuns
from tests.vm.study_lab import SETS

#: what writes move beyond DeepSpeed's files: xfs's log and metadata (tens of KiB a step)
FS_WRITES = 1024 * 1024


def _run_doc(fabric_runs: FabricRuns) -> dict[str, Any]:
    doc = fabric_runs.run
    assert doc["steps_done"] == FAB_STEPS, doc.get("error")
    return doc


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
