"""`iotune estimate --drives`: the storage a run needs, planned before it is bought. Gathers
what the plan is made from (a sweep, a run's swaps or a datasheet for one drive; the swept
drive's PCIe link from sysfs; the study's own steps for its presets) and returns the plan as
one document; :mod:`iotune.plan.drives` does the arithmetic.

One drive's bandwidth comes from the first of:

1. ``--aio-config SWEEP``: measured by ``sweep-aio`` (wins when a datasheet is given too,
   which then shows the derating the sweep measured);
2. ``--baseline RUN`` of a run whose optimizer state was on NVMe: the bandwidth its swaps
   had, over the drives of its volume;
3. ``--drive SPEC``: the datasheet's sequential figures, derated to what DeepSpeed's async
   I/O reaches (by the measurement above where there is one, else DeepSpeed's published
   ratio in configs/drives.toml).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iotune.errors import IotuneError, UsageError
from iotune.model.estimate import Estimate
from iotune.model.presets import Preset
from iotune.model.swapfiles import swap_files
from iotune.plan.cpus import CpuSpec
from iotune.plan.datasheet import (
    Derate,
    DriveSpec,
    link_bandwidth,
    load_profiles,
    parse_drive,
    parse_link,
)
from iotune.plan.drives import (
    DriveInputs,
    Limit,
    Raid,
    derate_text,
    parse_target,
    plan_drives,
    smallest_for,
    stripe_share,
)
from iotune.plan.measured import (
    STUDY,
    AdamRate,
    Bandwidth,
    Baseline,
    RunDrives,
    datasheet_bandwidth,
    run_drives,
)
from iotune.probes.host import Host
from iotune.probes.nvme_health import Health
from iotune.sweep.run import SweepRun, has_points
from iotune.units import GIB, binary_size, parse_quantity, parse_size

if TYPE_CHECKING:
    from iotune.trace.targets import Targets

#: mdadm's default RAID0 chunk (mdadm(8) --chunk), and `iotune raid create`'s
DEFAULT_CHUNK = 512 * 1024
DEFAULT_COUNTS = "1,2,4,8"


def drive_counts(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ks = []
    if not ks or any(k < 1 for k in ks):
        raise UsageError(
            f"--drives {text!r} is not a list of drive counts", hint="--drives 1,2,4,8"
        )
    return sorted(set(ks))


def _live(host: Host | None) -> Host:
    """*host*, else this machine (sysfs at /, udev, ip route)."""
    from iotune.probes.host import LiveHost

    return LiveHost() if host is None else host


def swept_link(aio_config: str | None, *, host: Host | None = None) -> Limit | None:
    """The PCIe link of the drive the sweep measured, when its target is on this host (or
    on *host*, a recorded one)."""
    from iotune.probes.blockdev import read_disk

    disks = _swept_disks(aio_config, host=host)
    if not disks:
        return None
    try:
        on = _live(host)
        links = [read_disk(on, n).pcie for n in disks]
    except (OSError, ValueError, IotuneError):
        return None
    speeds = [(link_bandwidth(f"{x.current_speed} x{x.current_width}"), x) for x in links if x]
    known = [(v, x) for v, x in speeds if v]
    if not known or len(known) != len(disks):
        return None
    v, x = min(known, key=lambda t: t[0])
    return Limit(
        f"PCIe link {x.current} per drive",  # as `devices` names it: "8.0 GT/s x4"
        v,
        "B/s",
        f"sysfs of {', '.join(disks)}",
    )


def _health(disks: list[str], *, host: Host | None = None) -> tuple[str, Health, float] | None:
    """The first of *disks* whose NVMe health log can be read: its name, the log and the
    drive's capacity (bytes)."""
    from iotune.probes.nvme_health import controller_of, read_health

    tree = _live(host).tree
    for disk in disks:
        ctrl = controller_of(tree, disk)
        health = read_health(ctrl) if ctrl else None
        sectors = tree.read_int(f"sys/block/{disk}/size")
        if health is not None and sectors:
            return disk, health, sectors * 512.0
    return None


def parse_network(text: str) -> float:
    """--network-link: '100G', '25GbE', '200Gb/s', '400 Gbit', '12.5GB/s' → bytes/s. A bare
    G is a link's gigabits, as network gear is named (100G Ethernet); GB/s is bytes."""
    return parse_quantity(
        text, what="--network-link", rate=True, bare="bits", example="100G, 25GbE or 12.5GB/s"
    )


def swept_network(aio_config: str | None, *, host: Host | None = None) -> Limit | None:
    """The network link in front of the swept drives where they are NVMe-oF namespaces: the
    slowest link of theirs that reports a speed."""
    from iotune.probes.fabrics import read_fabric

    disks = _swept_disks(aio_config, host=host)
    try:
        on = _live(host)
        fabrics = [read_fabric(on.tree, n, on.route_iface) for n in disks]
    except (OSError, ValueError, IotuneError):
        return None
    known = [f for f in fabrics if f is not None and f.link_bytes_s()]
    if not known:
        return None
    f = min(known, key=lambda x: x.link_bytes_s() or 0.0)
    return Limit(
        f"network link {f.link_text()}", f.link_bytes_s() or 0.0, "B/s", f"sysfs, {f.describe()}"
    )


def _swept_targets(aio_config: str | None, *, host: Host | None = None) -> Targets | None:
    """What the sweep's target is on this host (or *host*): its drives and arrays."""
    from iotune.trace.targets import resolve_path

    if not has_points(aio_config):
        return None
    target = SweepRun.load(Path(str(aio_config))).target
    try:
        return resolve_path(_live(host).tree, target) if target else None
    except (OSError, ValueError, IotuneError):
        return None


def _swept_disks(aio_config: str | None, *, host: Host | None = None) -> list[str]:
    t = _swept_targets(aio_config, host=host)
    return list(t.disks) if t is not None else []


def _swept_chunk(aio_config: str | None, *, host: Host | None = None) -> int | None:
    """The chunk of the array the sweep measured (None for one drive)."""
    t = _swept_targets(aio_config, host=host)
    return next((a.chunk_bytes for a in t.arrays if a.chunk_bytes), None) if t else None


def _one_drive(
    bw: Bandwidth | None, ran: RunDrives | None, spec: DriveSpec | None, default: Derate
) -> tuple[Bandwidth, Derate | None]:
    """One drive's bandwidth, and the derating of its datasheet where there is one."""
    measured = bw if bw is not None else ran.per_drive() if ran is not None else None
    if measured is None:
        if spec is None:
            raise UsageError(
                "--drives plans from one drive's bandwidth: name a sweep (--aio-config), a "
                "run of the optimizer state on NVMe (--baseline) or a datasheet (--drive)",
                hint="iotune sweep-aio --target /mnt/nvme0 --out SWEEP; then --aio-config "
                "SWEEP, or --drive samsung-980-pro-2tb",
            )
        return datasheet_bandwidth(spec, default), default
    if spec is None:
        return measured, None
    factor = Derate(
        measured.read / spec.read,
        measured.write / spec.write,
        f"measured / datasheet: {measured.source}",
        measured=True,
    )
    if bw is not None:  # a sweep stays the measured way in; the factor is shown beside it
        return measured, factor
    return replace(datasheet_bandwidth(spec, factor), source=f"{spec.label} datasheet"), factor


def _pct(read: float, write: float) -> str:
    r, w = f"{100 * read:.1f}%", f"{100 * write:.1f}%"
    return r if r == w else f"{r} read, {w} write"


def _study_steps(p: Preset) -> tuple[tuple[int, float], ...]:
    """The study's measured steps of this preset's model by drive count: its single NVMe
    and its RAID0 of 3."""
    from iotune.model.presets import preset_with
    from iotune.model.published import study_row

    if p.ga != 1 or not p.size:
        return ()
    out = []
    # the study's single drive and RAID0 of 3 of the same strategy, whichever of them p is
    one = p.strategy.name.replace("_raid0", "_nvme")
    for k, strategy in ((1, one), (3, one.replace("_nvme", "_raid0"))):
        try:
            row = study_row(preset_with(f"{strategy}_{p.size}", ()))
        except IotuneError:
            continue
        if row is not None and row.step_s is not None:
            out.append((k, row.step_s))
    return tuple(out)


def plan_storage(
    p: Preset,
    e: Estimate,
    cfg: dict[str, Any],
    *,
    bw: Bandwidth | None,
    adam: AdamRate | None,
    base: Baseline | None,
    aio_config: str | None,
    baseline: str | None,
    drive: str | None,
    drives: str | None,
    target: str | None,
    link: str | None,
    memory_bw: float | None,
    chunk: str | None,
    network: str | None = None,
    host: Host | None = None,
    cpu: CpuSpec | None = None,
    memory_measured: tuple[float, str] | None = None,
) -> dict[str, Any]:
    """--drives / --target-step: the plan as one document, with what it was made from; the
    swept drives are looked up on *host* (this machine where None)."""
    if not p.strategy.uses_nvme:
        raise UsageError(
            f"{p.name} keeps its optimizer state and parameters off NVMe "
            f"({p.strategy.name}): --drives plans the drives a run swaps to",
            hint=f"plan a preset that swaps to NVMe, e.g. opt_nvme_{p.size or '1b'}, or "
            "--checkpoint-every for a checkpoint volume",
        )
    spec = parse_drive(drive) if drive else None
    _, default = load_profiles()
    ks = drive_counts(drives or DEFAULT_COUNTS)
    goal = parse_target(target) if target is not None else None
    ran = None
    run_disks: list[str] = []
    if baseline and baseline != STUDY:
        from iotune.plan.rundoc import load_run

        doc = load_run(Path(baseline))
        run_disks = list(doc.get("drives") or [])
        if bw is None:
            ran = run_drives(doc, baseline)
    swept = _swept_disks(aio_config, host=host) if bw is not None else []
    sockets = None
    if swept:
        from iotune.probes.topology import crossing_note

        sockets = crossing_note(_live(host).tree, swept, max(1, e.ranks), "the swept volume")
    aio = cfg.get("aio") or p.aio or {}
    reads, writes = swap_files(p, cfg)
    raid = Raid(
        parse_size(chunk, what="--chunk") if chunk else DEFAULT_CHUNK,
        int(aio.get("block_size", 1 << 20)),
        int(aio.get("queue_depth", 8)),
        int(aio.get("intra_op_parallelism", 1)),
        "--chunk" if chunk else "mdadm's default chunk",
        max(1, e.ranks),
        tuple(reads),
        tuple(writes),
    )
    # the optimizer's files, which a swap rehearsal and a run's swap timings moved
    opt_files = swap_files(p, cfg, parameters=False)
    if bw is not None and len(swept) > 1:
        # a sweep of an array measured all its members at once: one drive is its share; a
        # rehearsal of the swaps had the stripe's share of their rate, on the array's chunk
        members = len(swept)
        c = _swept_chunk(aio_config, host=host) or raid.chunk
        swap = bw.pattern == "swap" and raid.streams == 1
        rs, ws = (stripe_share(f, c, members) if swap else 1.0 for f in opt_files)
        bw = replace(
            bw,
            read=bw.read / (members * rs),
            write=bw.write / (members * ws),
            source=f"{bw.source}, one of its {members} drives ({', '.join(swept)})",
        )
    if ran is not None and ran.drives > 1 and raid.streams == 1:
        # a run's swaps on an array had the stripe's share of its members' rate
        rs, ws = (stripe_share(f, raid.chunk, ran.drives) for f in opt_files)
        ran = replace(ran, read=ran.read / rs, write=ran.write / ws)
    one, derate = _one_drive(bw, ran, spec, default)
    lim: Limit | None
    if link:
        v = link_bandwidth(parse_link(link, "--link"))
        lim = Limit(f"PCIe link {link.strip()} per drive", v or 0.0, "B/s", "--link")
    elif spec is not None and spec.link:
        lim = Limit(
            f"PCIe link {spec.link} per drive",
            link_bandwidth(spec.link) or 0.0,
            "B/s",
            f"{spec.label} datasheet",
        )
    else:
        lim = swept_link(aio_config, host=host)
    if memory_bw is not None and not 0 < memory_bw <= 100_000:
        raise UsageError(
            f"--memory-bw must be the host's memory bandwidth in GiB/s, got {memory_bw:g}",
            hint="--memory-bw 95 (dual-channel DDR5-6400: 102.4 GB/s)",
        )
    mem = Limit("host memory", memory_bw * GIB, "B/s", "--memory-bw") if memory_bw else None
    if mem is None and cpu is not None:
        mem = Limit(f"host memory, {cpu.describe()}", cpu.node_memory_bw, "B/s", "--cpu")
    if mem is None and memory_measured is not None:
        mem = Limit("host memory (measured)", memory_measured[0], "B/s", memory_measured[1])
    net = (
        Limit(f"network link {network.strip()}", parse_network(network), "B/s", "--network-link")
        if network
        else swept_network(aio_config, host=host)
    )
    notes = [raid.describe(), *([sockets] if sockets else [])]
    shares = [(k, raid.share("read", k), raid.share("write", k)) for k in ks if k > 1]
    if any(min(r, w) < 0.995 for _, r, w in shares):
        notes.append(
            "RAID0 against the swap files: DeepSpeed's async I/O moves one file at a time and "
            "a file is done when its busiest member is, so this run's files get "
            + ", ".join(f"{_pct(r, w)} of {k} drives' rate" for k, r, w in shares)
            + f" (chunk {binary_size(raid.chunk)})"
        )
    capacity = writes_left = None
    if spec is None:
        found = _health(_swept_disks(aio_config, host=host) or run_disks, host=host)
        if found is not None:
            disk, health, capacity = found
            life = health.life_writes
            writes_left = None if life is None else max(0.0, life - health.written_bytes)
            notes.append(
                f"endurance from {disk}'s health log: {health.written_bytes / 1e12:.2f} TB "
                f"written, {health.percentage_used}% of its life used"
                + (
                    f": about {life / 1e12:,.0f} TB in all, {writes_left / 1e12:,.0f} TB left"
                    if life is not None and writes_left is not None
                    else " (too little wear to extrapolate its rated writes; --drive tbw= sets them)"
                )
            )
    inputs = DriveInputs(
        one,
        spec,
        lim,
        mem,
        raid,
        _study_steps(p),
        capacity=capacity,
        writes_left=writes_left,
        network=net,
    )
    plans = plan_drives(p, e, inputs, adam, base, ks)
    label = "datasheet" if one.pattern == "datasheet" else "measured"
    limits = [
        Limit(f"one drive, read ({label})", one.read, "B/s", one.source),
        Limit(f"one drive, write ({label})", one.write, "B/s", one.source),
    ]
    limits += [x for x in (lim, mem, net) if x is not None]
    fixed = next((pl for pl in plans if pl.compute_s is not None), None)
    if fixed is not None:
        for t in fixed.prediction.terms:
            if t.kind in ("adam", "compute"):
                limits.append(Limit(t.label, t.seconds, "s", t.source or "measured"))
    if derate is not None:
        notes.insert(0, f"derating of the datasheet: {derate_text(derate)}")
    if spec is not None and spec.label != "--drive":
        notes.append(f"datasheet: {spec.name}: {spec.source}")
        if spec.cache is not None and spec.after_cache is not None:
            notes.append(
                f"SLC cache {spec.cache / 1e9:.0f} GB a drive, then {spec.after_cache / 1e6:.0f} "
                f"MB/s ({spec.cache_source or spec.source}); the cache counted empty at each step"
            )
        elif spec.cache_source:
            notes.append(f"SLC cache: {spec.cache_source}")
    missing = []
    if lim is None:
        missing.append("PCIe link: not reported for the measured drive (--link sets it)")
    if mem is None:
        missing.append(
            "host memory bandwidth: not known (--cpu, --memory-bw or --threads-config sets it)"
        )
    rated = spec.rated_writes if spec is not None else writes_left
    if rated is None and not any("health log" in n for n in notes):
        missing.append(
            "rated endurance: not known (--drive with tbw=, or dwpd= and warranty_years=)"
        )
    out: dict[str, Any] = {
        "nvme_bytes": e.nvme_bytes,
        "capacity_bytes": capacity if spec is None else spec.capacity,
        "plans": [pl.to_json() for pl in plans],
        "limits": [{**asdict(x), "text": x.describe()} for x in limits],
        "notes": notes,
        "missing": missing,
        "drive": spec.to_json() if spec else None,
        "derate": asdict(derate) if derate else None,
        "baseline": None if base is None else {"kind": base.kind, "source": base.source},
        # K drives are a node's: its ranks (a GPU each) share them; every node has its own
        "node": {"ranks": max(1, e.ranks), "nodes": max(1, e.world // max(1, e.ranks))},
    }
    if goal is not None:
        k, why, target_s = smallest_for(p, e, inputs, adam, base, goal[0], goal[1])
        out["target"] = {
            "asked": target,
            "step_s": None if target_s is None else round(target_s, 3),
            "drives": k,
            "answer": why,
        }
    from iotune.model.published import study_row

    study = study_row(p)
    if study is not None:
        out["study"] = {"case": study.case, "step_s": study.step_s}
    return out
