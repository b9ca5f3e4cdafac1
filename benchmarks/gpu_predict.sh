#!/usr/bin/env bash
# GPU tier: the step-time prediction against the measurement for one size, with the sweep
# and the runs on the same disk in one call of at most 10 minutes. From the repository root
# with .whl/ and .debs/ carried (benchmarks/gpu_carry.sh fills them) and, when an earlier
# call left them, the built DeepSpeed ops in gpu-ops/tx.tgz:
#     . benchmarks/gpu_env.sh; bash benchmarks/gpu_predict.sh SIZE STEPS ROUNDS
# (IO_SIZE and REPEATS shape the sweep's points, 2G and 3 by default; ADAM=0 skips 1b.)
# In order, on the machine's one virtio disk limited to 512 KiB requests like an NVMe drive:
#   1. sweep-aio at 1M / queue depth 8 (and DeepSpeed's default 512K) with --swap-pattern
#      opt_nvme_SIZE: the preset's optimizer swapping rehearsed ROUNDS times at the
#      recommended block
#   1b. the same rehearsal with DeepSpeed's CPU Adam between each sub-group's reads and writes
#   2. iotune study --sizes SIZE --strategies opt_ram,opt_nvme --steps STEPS, predicting
#      from that sweep (the opt_ram run is the baseline: forward + backward, CPU step)
# $OUT gets the sweep, the study, their output, and the ops it built (ops.tgz).
set -u
size="${1:?size}" steps="${2:-3}" rounds="${3:-2}"
out="${OUT:-/tmp/gpu-out}"
off=/var/tmp/offload
res=/var/tmp/predict
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
    tar czf "$out/predict.tgz" -C /var/tmp predict
    [ -f gpu-ops/tx.tgz ] || tar czf "$out/ops.tgz" -C /tmp tx
}
trap save EXIT
{
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    nproc; free -g | head -2; lsblk -d -o NAME,SIZE,ROTA,MODEL; uname -r
} > "$out/machine.txt" 2>&1
iot() { python3 -m iotune "$@"; }

iot sweep-aio --target "$off" --block-size 1M --queue-depth 8 --threads 1 \
    --single-submit false --overlap-events true --io-size "${IO_SIZE:-2G}" \
    --repeats "${REPEATS:-3}" --strategy grid \
    --no-fio --swap-pattern "opt_nvme_$size" --swap-rounds "$rounds" --out "$res/sweep" \
    > "$out/sweep.txt" 2>&1
echo "=== sweep-aio: exit $? at $((SECONDS - start)) s" >&2
tail -6 "$out/sweep.txt" >&2
# the same rehearsal with DeepSpeed's CPU Adam updating each sub-group between its reads and
# its writes, as the step does
if [ "${ADAM:-1}" = 1 ]; then
python3 - "$size" "$rounds" "$off" > "$res/swap-adam.json" 2> "$out/swap-adam.txt" <<'PY'
import json, subprocess, sys
from iotune.sweep import swap
size, rounds, target = sys.argv[1:]
aio = json.load(open("/var/tmp/predict/sweep/result.json"))["aio"]
point, _ = swap.plan(f"opt_nvme_{size}", aio)
point.update(target=target, rounds=int(rounds), adam=True)
done = subprocess.run([sys.executable, "-m", "iotune.workers.aio_swap", json.dumps(point)],
                      stdout=subprocess.PIPE, check=True, text=True)
print(done.stdout.strip().splitlines()[-1])
PY
echo "=== swap with adam: exit $? at $((SECONDS - start)) s" >&2
cat "$res/swap-adam.json" >&2
fi
iot study --sizes "$size" --strategies opt_ram,opt_nvme --ga 1 --steps "$steps" \
    --nvme-path "$off" --aio-config "$res/sweep" --out "$res/study" > "$out/study.txt" 2>&1
echo "=== study: exit $? at $((SECONDS - start)) s" >&2
tail -30 "$out/study.txt" >&2
