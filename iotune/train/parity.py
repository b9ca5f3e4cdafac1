"""What a protected array's members did for a copy onto it (a save, a save's persist), from
the trace's intervals: their writes against the copy's bytes and RAID5/6's full-stripe ideal,
and what they read back. Pure."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from iotune.trace.targets import Array


def drive_sizes(
    io: dict[str, Any] | None, drives: tuple[str, ...], op: str
) -> dict[int, int] | None:
    """The requests of *op* the *drives* completed in an interval, by exact size (summed over
    the drives); None untraced."""
    per = (io or {}).get("drives") or {}
    if not drives or any(per.get(n, {}).get(f"{op}_sizes") is None for n in drives):
        return None
    out: dict[int, int] = {}
    for n in drives:
        for size, count in per[n][f"{op}_sizes"].items():
            out[int(size)] = out.get(int(size), 0) + int(count)
    return dict(sorted(out.items()))


#: the members that hold data, of K, by md level (the rest of a stripe is parity or copies)
_PARITY = {"raid5": 1, "raid6": 2}


def parity_traffic(
    level: str | None,
    chunk: int | None,
    members: dict[str, dict[str, Any]],
    saved: int,
    requests: int | None = None,
    asked: int | None = None,
) -> dict[str, Any] | None:
    """What a protected array's members did for one save: their bytes written against the
    save's, beside the full-stripe ideal (K/(K-1) for RAID5, K/(K-2) for RAID6, K for a
    mirror of K); reads on the members while only writing are the array reading old data and
    parity back to update a stripe the writes did not fill (read-modify-write, or its
    reconstruct-write twin). *members*: each member's ``read``/``write`` bytes and
    ``write_sizes``; *requests*: the writer's request size, for the advice on the chunk;
    *asked*: the bytes the array itself was asked to write (its diskstats: the save's files
    and the file system's log and metadata), against which the members' writes lie between
    the full-stripe ideal and the page-by-page worst (each page written alone with its P
    (and Q) pages: 2x for RAID5, 3x for RAID6). None for an array without redundancy. Pure."""
    k = len(members)
    if level == "raid1":
        d = 1
    elif level in _PARITY:
        d = k - _PARITY[level]
    else:
        return None
    if d < 1 or saved <= 0:
        return None
    written = sum(int(m["write"]) for m in members.values())
    read = sum(int(m["read"]) for m in members.values())
    ideal = k / d
    out: dict[str, Any] = {
        "level": level,
        "members": k,
        "chunk_bytes": chunk,
        "stripe_bytes": chunk * d if chunk and level != "raid1" else None,
        "saved_bytes": saved,
        "member_write_bytes": written,
        "member_read_bytes": read,
        "amplification": round(written / saved, 4),
        "ideal": round(ideal, 4),
        "excess_bytes": written - round(saved * ideal),
        "array_write_bytes": asked,
        "array_amplification": round(written / asked, 4) if asked else None,
        # every page written on its own: the page and the stripe's parity pages
        "partial_worst": float(k if level == "raid1" else 1 + _PARITY[level]),
        # more than the metadata a save reads: stripes were read back to be updated
        "read_modify_write": read > max(1 << 20, saved // 100),
        "per_member": {
            n: {"read": int(m["read"]), "write": int(m["write"]), "sizes": m.get("write_sizes")}
            for n, m in sorted(members.items())
        },
        "advice": None,
    }
    stripe = out["stripe_bytes"]
    chunk = chunk or 0
    if stripe and requests and requests % stripe:
        fits = (
            requests // d if requests % d == 0 and (requests // d) & (requests // d - 1) == 0 else 0
        )
        out["advice"] = (
            f"the writer's {requests // 1024} KiB requests do not fill the {stripe // 1024} KiB "
            f"stripe ({d} data members x {chunk // 1024} KiB chunk): "
            + (f"a chunk of {fits // 1024} KiB, or " if fits >= 4096 else "")
            + f"a writer block of a multiple of {stripe // 1024} KiB writes full stripes"
        )
    elif stripe and out["read_modify_write"]:
        out["advice"] = (
            f"the members read {read / 2**20:.1f} MiB back while writing: the writes did not "
            f"fill the {stripe // 1024} KiB stripes ({d} data members x {chunk // 1024} KiB "
            "chunk); a smaller chunk, or a writer that writes whole stripes, avoids it"
        )
    return out


def _summed(rows: list[dict[str, Any]], drives: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Each of *drives*' reads and writes over *rows* (intervals of the trace), with its
    writes by exact size."""
    out: dict[str, dict[str, Any]] = {}
    for n in drives:
        sizes: dict[int, int] | None = {}
        for r in rows:
            got = r["drives"][n].get("write_sizes")
            if got is None or sizes is None:  # untraced sizes (the diskstats backend)
                sizes = None
                continue
            for size, count in got.items():
                sizes[int(size)] = sizes.get(int(size), 0) + int(count)
        out[n] = {
            "read": sum(int(r["drives"][n]["read"]) for r in rows),
            "write": sum(int(r["drives"][n]["write"]) for r in rows),
            "write_sizes": None if sizes is None else dict(sorted(sizes.items())),
        }
    return out


def persist_io(
    p: dict[str, Any],
    io_steps: list[dict[str, Any]],
    drives: tuple[str, ...],
    array: Array | None,
    request_size: int | None,
) -> dict[str, Any]:
    """A persist's event with, traced, what the persist volume's *drives* did for it: the
    intervals from its save's end (``checkpoint:STEP``) to its own (``persist:STEP``, the
    wait for it) are the copy's. Nothing else of the run writes there but its losses file
    (a few hundred bytes after each step, iotune.workers.checkpoints.LossLedger) and the
    file system's journal. On a protected *array*, the parity it added (parity_traffic).
    Untraced, or its intervals not in the trace: the event as it is. Pure."""
    labels = [r["label"] for r in io_steps]
    start, end = f"checkpoint:{p.get('step')}", f"persist:{p.get('step')}"
    if not drives or start not in labels or end not in labels:
        return p
    span = io_steps[labels.index(start) + 1 : labels.index(end) + 1]
    if not span or any(n not in (r.get("drives") or {}) for r in span for n in drives):
        return p
    per = _summed(span, drives)
    asked = (
        sum(int((r.get("arrays") or {}).get(array.name, {}).get("write", 0)) for r in span)
        if array is not None and all(array.name in (r.get("arrays") or {}) for r in span)
        else None
    )
    parity = (
        parity_traffic(
            array.level,
            array.chunk_bytes,
            {n: per[n] for n in array.members},
            int(p.get("bytes") or 0),
            request_size,
            asked=asked,
        )
        if array is not None and all(n in per for n in array.members)
        else None
    )
    return {
        **p,
        "intervals": [r["label"] for r in span],
        "write_bytes": sum(m["write"] for m in per.values()),
        "read_bytes": sum(m["read"] for m in per.values()),
        "write_sizes": drive_sizes({"drives": per}, drives, "write"),
        "parity": parity,
    }
