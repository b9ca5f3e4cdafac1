"""Several ranks' records as one run's: one record per event and step from every rank's
(:func:`merge_ranks`: the slowest rank's times, the node's memory, each rank's own figures
kept), and each rank's steady step (:func:`per_rank`). Pure."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

_SLOWEST = (
    "forward_s",
    "backward_s",
    "accumulate_s",
    "optimizer_s",
    "step_s",
    "init_s",
    "blocked_s",
    "durable_s",
)
_SUMMED = (
    "host_rss_bytes",
    "host_rss_peak_bytes",
    "tokens_per_s",
)
#: a save's figures (iotune.workers.checkpoints): each rank walks the whole tag folder after
#: DeepSpeed's save_checkpoint, which ends in a barrier (and the decoupled writer's commit
#: in another), so every rank counts every rank's files: the folder's size is any rank's
#: count, the largest where one saw more, never their sum
_FOLDER = ("files", "bytes", "swap_copy_bytes")


def merge_ranks(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per event and step from every rank's: times are the slowest rank's (a
    ZeRO step waits for the last rank in its collectives), host memory and tokens/s the
    node's sum, GPU memory the largest device's, swap files the sum of each rank's own, a
    save's files the tag folder's (each rank counted all of them: _FOLDER), and "ranks"
    keeps each rank's figures. A single rank's records come back as they are.
    Pure."""
    groups: dict[tuple[str, Any, Any, Any], list[dict[str, Any]]] = {}
    for r in records:  # a persist's event has its save's step and tag; a resume's check, its
        key = (str(r.get("event")), r.get("step"), r.get("tag"), r.get("at_step"))
        groups.setdefault(key, []).append(r)
    out = []
    for recs in groups.values():
        if len(recs) == 1:
            out.append(recs[0])
            continue
        recs.sort(key=lambda r: int(r.get("rank", 0)))
        m = dict(recs[0])
        for k in _SLOWEST:
            if all(k in r for r in recs):
                m[k] = max(r[k] for r in recs)
        for k in _SUMMED:
            if all(r.get(k) is not None for r in recs):
                m[k] = round(sum(r[k] for r in recs), 2)
        for k in _FOLDER:
            if all(r.get(k) is not None for r in recs):
                m[k] = max(r[k] for r in recs)
        if all(r.get("peak_accel_bytes") is not None for r in recs):
            m["peak_accel_bytes"] = max(r["peak_accel_bytes"] for r in recs)
        for k in ("swap_copy", "resume_copy"):  # each rank copies its own rank folder
            if any(r.get(k) for r in recs):
                m[k] = [c for r in recs for c in r.get(k) or []]
        if "loss" in m:
            m["loss"] = round(statistics.mean(r["loss"] for r in recs), 5)
        if all(r.get("proc_io") for r in recs):
            m["proc_io"] = {
                k: sum(int(r["proc_io"].get(k, 0)) for r in recs)
                for k in ("read_bytes", "write_bytes")
            }
        if all("swap" in r for r in recs):
            m["swap"] = {
                k: sum(int(r["swap"].get(k, 0)) for r in recs)
                for k in ("allocated", "apparent", "files")
            }
        m.pop("rank", None)
        m["ranks"] = [
            {
                k: r.get(k)
                for k in (
                    "rank",
                    "node",
                    *_SLOWEST,
                    "host_rss_peak_bytes",
                    "peak_accel_bytes",
                    "swap_dir",
                    "proc_io",
                )
                if k in r
            }
            | ({"swap_allocated": r["swap"].get("allocated")} if "swap" in r else {})
            for r in recs
        ]
        out.append(m)
    return out


def per_rank(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rank's steady step (median over the steps after the first; the first when there
    is only one), its own storage I/O per steady step (from its /proc/PID/io), peak host RSS
    and swap files. Pure."""
    every: dict[int, list[dict[str, Any]]] = {}
    for s in steps:
        for r in s.get("ranks", []):
            every.setdefault(int(r["rank"]), []).append(r)
    out = []
    for rank, allr in sorted(every.items()):
        recs = allr[1:] or allr
        io = [
            (a["proc_io"], b["proc_io"])
            for a, b in itertools.pairwise(allr)
            if a.get("proc_io") and b.get("proc_io")
        ]
        moved = {
            f"{op}_bytes_per_step": int(
                statistics.median(b[f"{op}_bytes"] - a[f"{op}_bytes"] for a, b in io)
            )
            if io
            else None
            for op in ("read", "write")
        }
        out.append(
            {
                "rank": rank,
                "node": recs[0].get("node"),
                "step_s": round(statistics.median(r["step_s"] for r in recs), 4),
                "optimizer_s": round(statistics.median(r["optimizer_s"] for r in recs), 4),
                "host_rss_peak_bytes": max((r.get("host_rss_peak_bytes") or 0) for r in allr),
                "peak_accel_bytes": max((r.get("peak_accel_bytes") or 0) for r in allr) or None,
                "swap_allocated": max((r.get("swap_allocated") or 0) for r in allr),
                "swap_dir": recs[0].get("swap_dir"),
                **moved,
            }
        )
    return out
