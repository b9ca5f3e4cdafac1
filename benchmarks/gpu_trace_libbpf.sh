#!/usr/bin/env bash
# GPU tier: the libbpf tracer on the real workload, in one call of at most 10 minutes. From
# the repository root with .whl/, .debs/ and .bpf/ carried (benchmarks/gpu_carry.sh fills
# them; .bcc/ too for the attach-time comparison with bcc):
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_libbpf.sh; bash benchmarks/gpu_trace_libbpf.sh PART
# PART 1: doctor (which tracer runs and why), the tracers' attach + detach times (libbpf vs
#   bcc, alternating, when .bcc/ was carried), then `iotune trace --run opt_nvme_1b` and
#   `iotune run opt_nvme_1b`, alternating while time is left (the tracer's cost on the step)
# PART 2: `iotune trace --run opt_nvme_3b --steps 2` (its cross-check on the virtio disk),
#   then more alternations of PART 1's pair while time is left
# PART 5: the same pair on a RAM-backed drive, a loop device with direct I/O over a file in
#   a tmpfs (ext4): the virtio disk's own variation is gone, and the tracer's cost per second
#   is at its highest (every step's 37 GiB move at memory speed); the kernel's BPF statistics
#   are on for the traced runs only
# $OUT gets part-PART.tgz: every run's JSON, output and run folder.
set -u
part="${1:?part}"
out=/tmp/gpu-res/part$part
trap 'tar czf "${OUT:-/tmp}/part-$part.tgz" -C /tmp/gpu-res "part$part"' EXIT
off=/var/tmp/offload
budget="${BUDGET:-540}"
mkdir -p "$out" "$off"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
echo 512 > /sys/block/vda/queue/max_sectors_kb
start=$SECONDS
iot() { python3 -m iotune "$@"; }
if [ "$part" = 1 ]; then
    {
        nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
        nproc; free -g | head -2; lsblk -d -o NAME,SIZE,ROTA,MODEL; uname -r
        grep -o 'avx512_bf16\|amx_bf16' /proc/cpuinfo | sort -u
    } > "$out/machine.txt" 2>&1
    iot --json doctor > "$out/doctor.json" 2> "$out/doctor.err"
    echo "=== doctor: exit $? at $((SECONDS - start)) s" >&2
    python3 - <<'PY' >&2
import json, os
d = json.load(open("/tmp/gpu-res/part1/doctor.json"))
for c in d["checks"]:
    if c["name"] in ("BTF", "libbpf", "libbpf load", "bcc", "kernel headers", "BPF load", "tracer"):
        print(f'{c["name"]}: {c["status"]}: {c["found"]}')
PY
    if [ -d .bcc ]; then
        (. benchmarks/gpu_bcc.sh && python3 - > "$out/attach.txt" 2>&1 <<'PY'
import statistics
from benchmarks.trace_overhead import attach_times
t = attach_times("/dev/vda", 3)
lb, bc = statistics.median(t["libbpf"]), statistics.median(t["bcc"])
print(f"attach + detach (median of 3): libbpf {1000 * lb:.0f} ms, bcc {1000 * bc:.0f} ms: "
      f"libbpf/bcc = {lb / bc:.3f}")
PY
        )
        echo "=== attach: exit $? at $((SECONDS - start)) s" >&2
        tail -1 "$out/attach.txt" >&2
    fi
fi
if [ "$part" = 2 ]; then
    rm -rf "${off:?}"/*
    iot --json trace --run opt_nvme_3b --steps 2 --nvme-path "$off" --out "$out/r3b" \
        > "$out/trace_3b.json" 2> "$out/trace_3b.err"
    echo "=== trace opt_nvme_3b: exit $? at $((SECONDS - start)) s" >&2
fi
if [ "$part" = 5 ]; then
    off=/mnt/ramdrive
    if ! mountpoint -q "$off"; then
        # a tmpfs of its own: a container's /dev/shm may be small
        mkdir -p /mnt/ramfs && mount -t tmpfs -o size=25g tmpfs /mnt/ramfs
        truncate -s 24G /mnt/ramfs/ramdrive.img
        dev=$(losetup --find --show --direct-io=on /mnt/ramfs/ramdrive.img)
        mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$dev"
        mkdir -p "$off" && mount -o noatime "$dev" "$off"
    fi
    findmnt -no SOURCE "$off" > "$out/ramdrive.txt"
    echo "=== RAM drive $(cat "$out/ramdrive.txt") at $((SECONDS - start)) s" >&2
fi
# PART 4: the same pair with the kernel's BPF statistics on, so each trace also records what
#   its programs cost by the kernel's clock (bpf_time in its JSON), run first
first=trace second=run
if [ "$part" = 4 ]; then
    sysctl -qw kernel.bpf_stats_enabled=1
    first=run second=trace
fi
# a later call of the same part on a warm machine numbers its pairs on
i=$(find "$out" -maxdepth 1 -name "p${part}_*_run.json" | wc -l)
while [ $((SECONDS - start)) -lt "$budget" ]; do
    i=$((i + 1))
    if [ "$part" = 5 ]; then  # each goes first in every other pair; FIRST=run starts with run
        a="${FIRST:-trace}" b=run
        [ "$a" = run ] && b=trace
        if [ $((i % 2)) = 1 ]; then first=$a second=$b; else first=$b second=$a; fi
    fi
    for cmd in $first $second; do
        [ $((SECONDS - start)) -lt "$budget" ] || break
        rm -rf "${off:?}"/*
        if [ "$part" = 5 ]; then  # the traced runs record their programs' time (bpf_time)
            sysctl -qw kernel.bpf_stats_enabled=$([ "$cmd" = trace ] && echo 1 || echo 0)
        fi
        tag="p${part}_${i}_${cmd}"
        if [ "$cmd" = trace ]; then
            iot --json trace --run opt_nvme_1b --steps "${STEPS:-4}" --nvme-path "$off" --out "$out/$tag" \
                > "$out/$tag.json" 2> "$out/$tag.err"
        else
            iot --json run opt_nvme_1b --steps "${STEPS:-4}" --nvme-path "$off" --out "$out/$tag" \
                > "$out/$tag.json" 2> "$out/$tag.err"
        fi
        echo "=== $tag: exit $? at $((SECONDS - start)) s" >&2
    done
done
