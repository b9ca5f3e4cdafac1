"""What a trace leaves behind: the bytes other submitters sent to the traced drives (named,
never folded into the workload's), and the run directory's trace.json, summary.csv and
sizes.csv."""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

from iotune.probes.sysfs import SysTree
from iotune.trace import model
from iotune.trace.diskstats import DiskStat

log = logging.getLogger("iotune.trace")


def other_io(
    owners: dict[tuple[int, int, int], tuple[int, int]],
    comms: dict[int, str],
    devs: dict[str, int],
) -> dict[str, Any]:
    """Bytes the traced drives received from the workload and from every other submitter
    (bio level, before merging): what was not the workload's is named, never folded in."""
    name_of = {v: k for k, v in devs.items()}
    workload = {"read": 0, "write": 0}
    others: dict[tuple[int, str], dict[str, Any]] = {}
    for (dev, op, tgid), (_bios, sectors) in owners.items():
        if dev not in name_of or op > 1:
            continue
        key = model.OPS[op]
        if tgid == 0:
            workload[key] += sectors * 512
            continue
        row = others.setdefault(
            (tgid, name_of[dev]),
            {
                "pid": tgid,
                "comm": comms.get(tgid, "?"),
                "device": name_of[dev],
                "read": 0,
                "write": 0,
            },
        )
        row[key] += sectors * 512
    rows = sorted(others.values(), key=lambda r: -(r["read"] + r["write"]))
    rows = [r for r in rows if r["read"] or r["write"]]
    return {
        "workload_bytes": workload,
        "other_bytes": {op: sum(r[op] for r in rows) for op in ("read", "write")},
        "others": rows,
    }


def opjson(st: model.OpStats) -> dict[str, Any]:
    return {
        "bytes": st.bytes,
        "requests": st.requests,
        "focus_requests": st.focus_requests,
        "other_requests": st.other_requests,
        "sizes": {str(k): v for k, v in st.sizes.items()},
    }


def write_outputs(out: Path, result: dict[str, Any]) -> None:
    (out / "trace.json").write_text(json.dumps(result, indent=2) + "\n")
    with (out / "summary.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "device",
                "kind",
                "op",
                "bytes",
                "requests",
                "focus_size",
                "focus_requests",
                "other_requests",
                "diskstats_ios",
                "diskstats_bytes",
            ]
        )
        for kind, rows in (("disk", result["devices"]), ("array", result["arrays"])):
            for d in rows:
                for op in ("read", "write"):
                    ks = d.get("diskstats", {})
                    w.writerow(
                        [
                            d["name"],
                            kind,
                            op,
                            d[op]["bytes"],
                            d[op]["requests"],
                            result["focus_size"],
                            d[op]["focus_requests"],
                            d[op]["other_requests"],
                            ks.get(f"{op}_ios", ""),
                            ks.get(f"{op}_bytes", ""),
                        ]
                    )
    with (out / "sizes.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["device", "op", "bytes", "requests"])
        for d in result["devices"]:
            for op in model.OPS:
                for size, n in d[op]["sizes"].items():
                    w.writerow([d["name"], op, size, n])


def devinfo(tree: SysTree, name: str) -> dict[str, Any]:
    """A traced drive's identity and queue limits, for its entry in trace.json."""
    base = f"/sys/block/{name}"
    return {
        "name": name,
        "path": f"/dev/{name}",
        "model": (tree.read(f"{base}/device/model") or "").strip() or None,
        "serial": (tree.read(f"{base}/device/serial") or "").strip() or None,
        "max_sectors_kb": tree.read_int(f"{base}/queue/max_sectors_kb"),
        "max_hw_sectors_kb": tree.read_int(f"{base}/queue/max_hw_sectors_kb"),
        # bios larger than max_segments x max_segment_size are split too
        "max_segments": tree.read_int(f"{base}/queue/max_segments"),
        "max_segment_size": tree.read_int(f"{base}/queue/max_segment_size"),
    }


def diskstats_json(kernel: DiskStat) -> dict[str, int]:
    """The kernel's counters over the trace, as a device's record keeps them."""
    return {
        "read_ios": kernel.read_ios,
        "read_bytes": kernel.read_bytes,
        "write_ios": kernel.write_ios,
        "write_bytes": kernel.write_bytes,
        "discard_ios": kernel.discard_ios,
        "flush_ios": kernel.flush_ios,
    }


def check_json(chk: model.Check, settled: bool) -> dict[str, Any]:
    """A device's cross-check of the traced requests against the kernel's counters."""
    return {
        "exact": chk.exact,
        "summary": chk.describe(),
        "empty_preflush_writes": chk.empty_preflush_writes,
        "unseen_completions": chk.unseen_completions,
        "flush_sequenced_writes": chk.write.flush_seq_done,
        "inflight_start": {
            "read": chk.read.inflight_start,
            "write": chk.write.inflight_start,
        },
        "inflight_end": {
            "read": chk.read.inflight_end,
            "write": chk.write.inflight_end,
        },
        "completed": {
            "read_ios": chk.read.done[0],
            "read_sectors": chk.read.done[1],
            "write_ios": chk.write.done[0],
            "write_sectors": chk.write.done[1],
        },
        "snapshots_settled": settled,
    }
