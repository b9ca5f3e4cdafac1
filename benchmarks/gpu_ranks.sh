#!/usr/bin/env bash
# GPU tier, two GPUs (the device tool's nvidia-h200-x2): opt_ram_1b and opt_nvme_1b with one
# and with two ranks through DeepSpeed's launcher, side by side in one call, on the machine's
# one virtio disk limited to 512 KiB requests like an NVMe drive. From the repository root
# with .whl/ and .debs/ carried (benchmarks/gpu_carry.sh fills them) and the built DeepSpeed
# ops in gpu-ops/tx.tgz:
#     . benchmarks/gpu_env.sh; bash benchmarks/gpu_ranks.sh [RAM_STEPS] [NVME_STEPS]
# $OUT gets each run's table (RUN.txt) and records (ranks.tgz: run.json, steps.jsonl, ...).
set -u
ram_steps="${1:-3}" nvme_steps="${2:-2}"
out="${OUT:-/tmp/gpu-out}"
off=/var/tmp/offload
res=/var/tmp/ranks
rm -rf "$res" "${off:?}"/*  # a machine kept warm from an earlier call keeps its files
mkdir -p "$out" "$off" "$res"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
if [ -f gpu-ops/tx.tgz ]; then
    tar xzf gpu-ops/tx.tgz -C /tmp
    # the sources pip just unpacked are newer than the carried objects: date them back so
    # ninja finds the build up to date (the paths and flags are the same as when it built)
    find /tmp/site/deepspeed -exec touch -h -d 2020-01-01 {} +
fi
echo 512 > /sys/block/vda/queue/max_sectors_kb
start=$SECONDS
save() {
    tar czf "$out/ranks.tgz" --exclude='*.npy' -C /var/tmp ranks
}
trap save EXIT
{
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    nproc; free -g | head -2; lsblk -d -o NAME,SIZE,ROTA,MODEL; uname -r
} > "$out/machine.txt" 2>&1
iot() { python3 -m iotune "$@"; }
for run in "opt_ram_1b 1 $ram_steps" "opt_ram_1b 2 $ram_steps" \
           "opt_nvme_1b 2 $nvme_steps" "opt_nvme_1b 1 $nvme_steps"; do
    set -- $run
    name="$1-r$2"
    iot run "$1" --ranks "$2" --steps "$3" --nvme-path "$off" --out "$res/$name" \
        > "$out/$name.txt" 2> "$out/$name.err"
    echo "=== $name: exit $? at $((SECONDS - start)) s" >&2
    cat "$out/$name.txt" >&2
done
