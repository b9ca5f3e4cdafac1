#!/usr/bin/env bash
# GPU tier: a small study with its prediction inputs, on one GPU machine, in calls of at
# most 10 minutes that each start on a fresh machine. From the repository root, with .whl/,
# .debs/, .bcc/ carried (benchmarks/gpu_carry.sh fills them) and, after the first call,
# gpu-state/ (the previous call's study.tgz unpacked there):
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_bcc.sh; bash benchmarks/gpu_study_grid.sh SECONDS
# Each call restores /var/tmp/study from gpu-state/, measures what is still missing in this
# order, and stops the study with SIGINT after SECONDS (it resumes in the next call):
#   1. sweep-aio on the offload disk at the presets' aio block (512K, queue depth 8, 1 thread)
#      and 1M / 32, reads and writes, 2 GiB per point
#   2. sweep-threads: CPU Adam on 1e9 parameters at 4, 8 and 16 threads
#   3. the 1B study: gpu_baseline, opt_ram, opt_nvme, opt_nvme_zenflow x GA 1 and 4, 4 steps
#   4. the 3B study: opt_ram, opt_nvme, GA 1, 3 steps
# The offload directory is on the machine's one virtio disk, limited to 512 KiB requests
# like the study's NVMe drives. $OUT/study.tgz carries the state to the next call.
set -u
budget="${1:-540}"
out="${OUT:-/tmp/gpu-out}"
off=/var/tmp/offload
res=/var/tmp/study
mkdir -p "$out" "$off" "$res"
echo 512 > /sys/block/vda/queue/max_sectors_kb
export PYTHONUNBUFFERED=1
start=$SECONDS
if [ -d gpu-state/study ]; then cp -a gpu-state/study/. "$res/"; fi
left() { echo $((budget - (SECONDS - start))); }
save() { tar czf "$out/study.tgz" -C /var/tmp --exclude='*.npy' study; }
trap save EXIT
iot() { python3 -m iotune "$@"; }

if [ ! -f "$res/sweep-aio/result.json" ]; then
    rm -rf "$res/sweep-aio"
    iot sweep-aio --target "$off" --block-size 512K,1M --queue-depth 8,32 --threads 1 \
        --single-submit false --overlap-events true --io-size 2G --repeats 3 --strategy grid \
        --no-fio --out "$res/sweep-aio" > "$out/sweep-aio.txt" 2>&1
    echo "=== sweep-aio: exit $? at $((SECONDS - start)) s" >&2
    tail -25 "$out/sweep-aio.txt" >&2
fi
if [ ! -f "$res/threads/threads.json" ] || ! grep -q '"threads": 16' "$res/threads/threads.json"; then
    iot sweep-threads --params 1e9 --threads 4,8,16 --repeats 3 --out "$res/threads" \
        > "$out/threads.txt" 2>&1
    echo "=== sweep-threads: exit $? at $((SECONDS - start)) s" >&2
    cat "$out/threads.txt" >&2
fi
study() {  # DIR ARGS...: start or resume a study, stopped with SIGINT when the budget ends
    local dir="$1"; shift
    local t; t=$(left)
    [ "$t" -gt 60 ] || { echo "=== $dir: no time left in this call" >&2; return 1; }
    if [ -f "$dir/study.json" ]; then
        timeout -s INT -k 60 "$t" python3 -m iotune study --resume "$dir"
    else
        timeout -s INT -k 60 "$t" python3 -m iotune study "$@" --out "$dir" \
            --nvme-path "$off" --aio-config "$res/sweep-aio" --threads-config "$res/threads"
    fi
    local rc=$?
    echo "=== $dir: exit $rc at $((SECONDS - start)) s" >&2
    return $rc
}
study "$res/study-1b" --sizes 1b --strategies gpu_baseline,opt_ram,opt_nvme,opt_nvme_zenflow \
    --ga 1,4 --steps 4 > "$out/study-1b.txt" 2>&1 || { tail -40 "$out/study-1b.txt" >&2; exit 0; }
tail -20 "$out/study-1b.txt" >&2
study "$res/study-3b" --sizes 3b --strategies opt_ram,opt_nvme --ga 1 --steps 3 \
    > "$out/study-3b.txt" 2>&1
tail -20 "$out/study-3b.txt" >&2
