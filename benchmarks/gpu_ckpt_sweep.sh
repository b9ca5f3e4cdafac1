#!/usr/bin/env bash
# GPU tier: `iotune sweep-checkpoint` on the GPU machine's disk, with DeepSpeed's own writer
# factory (its buffer pinned by CUDA), in one call of at most 10 minutes. From the repository
# root with .whl/, .debs/ and .bpf/ carried (benchmarks/gpu_carry.sh fills them):
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_libbpf.sh; bash benchmarks/gpu_ckpt_sweep.sh
# First the volume's swept write bandwidth (`sweep-aio --ops write --no-fio`: this machine has
# no fio), then the writer's search for PARAMS (default 1B: the 1B preset's optimizer state,
# 12 GB) with that sweep as its ceiling, its best merged into a DeepSpeed config.
# GRID: sweep-checkpoint's knob options (default: its own); the search stops after
# CKPT_TIMEOUT seconds (default 420, so that the call returns its records: --resume goes on).
# $OUT gets ckpt_sweep.tgz: both runs' records, their JSON and output (one file: a call
# returns only so many).
set -u
params="${PARAMS:-1B}"
out=/tmp/gpu-res/ckpt_sweep
trap 'tar czf "${OUT:-/tmp}/ckpt_sweep.tgz" -C /tmp/gpu-res ckpt_sweep' EXIT
ck=/var/tmp/ckpt
mkdir -p "$out" "$ck"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda
start=$SECONDS
iot() { python3 -m iotune "$@"; }
. benchmarks/gpu_ckpt_prelude.sh
ckpt_prelude "$out"
echo "=== ops built: exit $? at $((SECONDS - start)) s" >&2
iot --json sweep-aio --target "$ck" --ops write --no-fio --strategy grid --block-size 1M,8M \
    --queue-depth 32,128 --threads 1,8 --single-submit false --overlap-events true \
    --io-size 2G --repeats 2 --out "$out/aio" > "$out/aio.json" 2> "$out/aio.err"
echo "=== sweep-aio: exit $? at $((SECONDS - start)) s" >&2
echo '{"train_micro_batch_size_per_gpu": 1}' > "$out/ds_config.json"
# shellcheck disable=SC2086 # GRID is a list of options
timeout -s INT "${CKPT_TIMEOUT:-420}" python3 -m iotune sweep-checkpoint --target "$ck" \
    --params "$params" --aio-config "$out/aio" ${GRID:-} --out "$out/ckpt" \
    --write-config "$out/ds_config.json" > "$out/ckpt.txt" 2> "$out/ckpt.err"
echo "=== sweep-checkpoint: exit $? at $((SECONDS - start)) s" >&2
cat "$out/ckpt.txt" >&2
tail -5 "$out/ckpt.err" >&2
