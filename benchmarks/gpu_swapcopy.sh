#!/usr/bin/env bash
# GPU tier, one GPU: the swap files' copy of a save (issue: saves at the drives' speed), in two
# calls of at most 10 minutes each, back to back on one warm machine. From the repository root
# with .whl/, .debs/ and .xfs/ carried (benchmarks/gpu_carry.sh fills them; .xfs/ holds
# Debian 12's xfsprogs, libinih1 and liburcu8: the machine has no mkfs.xfs):
#     . benchmarks/gpu_env.sh; bash benchmarks/gpu_swapcopy.sh pairs
#     . benchmarks/gpu_env.sh; bash benchmarks/gpu_swapcopy.sh runs
# pairs: benchmarks/swapcopy_pairs.py for opt_nvme_1b's 14.8 GB swap folder, 3 rounds in
#   turns between two folders of the machine's one disk (ceiling, aio, deepspeed).
# runs: `iotune run opt_nvme_1b` with its saves copied by reflink on an XFS (reflink on,
#   mkfs.xfs's default) on a loop device over a file of that disk, checkpoints on
#   the offload volume as a snapshot must be (4 steps, a save after steps 2 and 4: step 3
#   rewrites the shared extents, steps 1 and 2 none), then, the XFS gone, by aio between two
#   folders of the disk (2 steps, a save after each; --force: one disk holds both).
# persist: `iotune run opt_nvme_1b` with its saves taken as reflink snapshots on that XFS and
#   persisted beside the training into a folder of the disk's own ext4 (--checkpoint-persist):
#   4 steps, a save after step 3 (the disk's 64 GiB hold one persisted save beside the
#   swap files and the snapshot's copy on write): steps 2 and 3 against step 4, which
#   ran beside the persist, the copy's time and the run's end's wait.
# ram: the same copies between two volumes faster than the page cache's copy, as NVMe drives
#   are and the machine's virtio disk is not: two XFS on loop devices (direct I/O) over files
#   of a tmpfs. `iotune sweep-checkpoint --copy-from` finds the aio copy's settings against
#   the raw O_DIRECT copy and copytree (1B parameters, 12 GB), then swapcopy_pairs.py takes
#   opt_nvme_1b's 14.8 GB folder 3 rounds in turns at DeepSpeed's defaults and at the sweep's
#   best.
# $OUT gets each part's output and records.
set -u
out="${OUT:-/tmp/gpu-out}"
mkdir -p "$out"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda
echo 512 > /sys/block/vda/queue/max_sectors_kb
start=$SECONDS
xfs=/mnt/iotune-xfs
xfs_tools() {
    mkdir -p /tmp/xfs
    for d in .xfs/*.deb; do dpkg -x "$d" /tmp/xfs; done
    export PATH="/tmp/xfs/sbin:/tmp/xfs/usr/sbin:$PATH"
    export LD_LIBRARY_PATH="/tmp/xfs/usr/lib/x86_64-linux-gnu:/tmp/xfs/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
}
mount_xfs() {
    mountpoint -q "$xfs" && return 0
    mkdir -p "$xfs"
    xfs_tools
    truncate -s 60G /var/tmp/xfs.img
    dev=$(losetup --find --show --direct-io=on /var/tmp/xfs.img) || return 1
    echo 512 > "/sys/block/${dev#/dev/}/queue/max_sectors_kb"
    mkfs.xfs -q -f "$dev" && mount -o discard "$dev" "$xfs" || return 1
    xfs_info "$xfs" | grep -o "reflink=[01]"
}
case "${1:?pairs, runs, persist or ram}" in
pairs)
    {
        nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
        nproc; free -g | head -2; lsblk -d -o NAME,SIZE,ROTA,MODEL; uname -r; df -h /var/tmp
        cat /sys/block/vda/queue/scheduler /sys/block/vda/queue/max_sectors_kb
        git log -1 --format=%h 2>/dev/null
    } > "$out/machine.txt" 2>&1
    python3 -c 'from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder
AsyncIOBuilder().load(); CPUAdamBuilder().load()' > "$out/build.txt" 2>&1
    echo "=== ops built: exit $? at $((SECONDS - start)) s" >&2
    mkdir -p /var/tmp/off /var/tmp/ck
    python3 benchmarks/swapcopy_pairs.py --src /var/tmp/off --dst /var/tmp/ck --rounds 3 \
        --out "$out/pairs_disk.json" 2>&1 | tee "$out/pairs_disk.txt"
    echo "=== pairs on the disk: exit ${PIPESTATUS[0]} at $((SECONDS - start)) s" >&2
    rm -rf /var/tmp/off /var/tmp/ck
    ;;
runs)
    mount_xfs > "$out/xfs.txt" 2>&1 || { cat "$out/xfs.txt"; exit 1; }
    rm -rf "${xfs:?}"/* /var/tmp/off /var/tmp/ck
    mkdir -p "$xfs/off"
    iot() { python3 -m iotune "$@"; }
    iot --json run opt_nvme_1b --steps 4 --checkpoint-every 2 --checkpoint-copy reflink \
        --nvme-path "$xfs/off" --checkpoint-dir "$xfs/ck" --out /tmp/runs/reflink \
        > "$out/run_reflink.json" 2> "$out/run_reflink.err"
    echo "=== reflink run: exit $? at $((SECONDS - start)) s" >&2
    tail -3 "$out/run_reflink.err" >&2
    umount "$xfs" && losetup -D && rm -f /var/tmp/xfs.img
    mkdir -p /var/tmp/off /var/tmp/ck
    iot --json run opt_nvme_1b --steps 2 --checkpoint-every 1 --checkpoint-copy aio \
        --nvme-path /var/tmp/off --checkpoint-dir /var/tmp/ck/aio --force --out /tmp/runs/aio \
        > "$out/run_aio.json" 2> "$out/run_aio.err"
    echo "=== aio run: exit $? at $((SECONDS - start)) s" >&2
    tail -3 "$out/run_aio.err" >&2
    tar czf "$out/runs.tgz" -C /tmp runs
    ;;
persist)
    {
        nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
        nproc; free -g | head -2; lsblk -d -o NAME,SIZE,ROTA,MODEL; uname -r; df -h /var/tmp
        git log -1 --format=%h 2>/dev/null
    } > "$out/machine.txt" 2>&1
    mount_xfs > "$out/xfs.txt" 2>&1 || { cat "$out/xfs.txt"; exit 1; }
    rm -rf "${xfs:?}"/* /var/tmp/ck
    mkdir -p "$xfs/off" /var/tmp/ck
    python3 -m iotune --json run opt_nvme_1b --steps 4 --checkpoint-every 3 \
        --checkpoint-copy reflink --nvme-path "$xfs/off" --checkpoint-dir "$xfs/snap" \
        --checkpoint-persist /var/tmp/ck/persist --out /tmp/runs/persist \
        > "$out/run_persist.json" 2> "$out/run_persist.err"
    echo "=== persist run: exit $? at $((SECONDS - start)) s" >&2
    tail -3 "$out/run_persist.err" >&2
    du -sb /var/tmp/ck/persist/* > "$out/persist_du.txt" 2>&1
    ls -la "$xfs/snap" >> "$out/persist_du.txt" 2>&1
    tar czf "$out/runs.tgz" -C /tmp runs
    ;;
ram)
    {
        nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
        nproc; free -g | head -2; uname -r; git log -1 --format=%h 2>/dev/null
    } > "$out/machine.txt" 2>&1
    python3 -c 'from deepspeed.ops.op_builder import AsyncIOBuilder
AsyncIOBuilder().load()' > "$out/build.txt" 2>&1
    echo "=== op built: exit $? at $((SECONDS - start)) s" >&2
    xfs_tools
    mkdir -p /mnt/iot-ram
    mountpoint -q /mnt/iot-ram || mount -t tmpfs -o size=70G tmpfs /mnt/iot-ram
    for v in off ck; do
        mountpoint -q "/mnt/iot-$v" && continue
        truncate -s 32G "/mnt/iot-ram/$v.img"
        dev=$(losetup --find --show --direct-io=on "/mnt/iot-ram/$v.img") || exit 1
        mkdir -p "/mnt/iot-$v"
        mkfs.xfs -q -f "$dev" && mount "$dev" "/mnt/iot-$v" || exit 1
        echo "$v: $dev $(cat "/sys/block/${dev#/dev/}/loop/dio") dio" >> "$out/machine.txt"
    done
    # BEST='{"block_size": ...}' (a call before this one swept them): the pairs only
    best="${BEST:-}"
    if [ -z "$best" ]; then
        python3 -m iotune --json sweep-checkpoint --copy-from /mnt/iot-off --target /mnt/iot-ck \
            --params 1B --out /tmp/runs/sweep > "$out/sweep.json" 2> "$out/sweep.err"
        echo "=== sweep: exit $? at $((SECONDS - start)) s" >&2
        tail -5 "$out/sweep.err" >&2
        best=$(python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
b = (d.get("best") or {}).get("settings") or {}
print(json.dumps({k: b[k] for k in ("block_size", "queue_depth", "intra_op_parallelism") if k in b}))' \
            "$out/sweep.json" 2>/dev/null || echo '{}')
    fi
    echo "=== best: $best" >&2
    rm -rf /mnt/iot-off/* /mnt/iot-ck/*
    python3 benchmarks/swapcopy_pairs.py --src /mnt/iot-off --dst /mnt/iot-ck --rounds 3 \
        --aio "$best" --out "$out/pairs_ram_best.json" 2>&1 | tee "$out/pairs_ram_best.txt"
    echo "=== pairs, the sweep's best: exit ${PIPESTATUS[0]} at $((SECONDS - start)) s" >&2
    python3 benchmarks/swapcopy_pairs.py --src /mnt/iot-off --dst /mnt/iot-ck --rounds 3 \
        --out "$out/pairs_ram_default.json" 2>&1 | tee "$out/pairs_ram_default.txt"
    echo "=== pairs, defaults: exit ${PIPESTATUS[0]} at $((SECONDS - start)) s" >&2
    tar czf "$out/runs.tgz" -C /tmp runs
    ;;
esac
