#!/usr/bin/env bash
# GPU tier: the tuned fast writer against the volume's write ceiling and torch.save, taking
# turns on the GPU machine's disk (benchmarks/ckpt_pairs.py), in one call of at most 10
# minutes. From the repository root with .whl/, .debs/ and .bpf/ carried:
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_libbpf.sh; bash benchmarks/gpu_ckpt_pairs.sh
# PARAMS (default 500M: 5.59 GiB saves), ROUNDS (default 5), KNOBS (JSON; default the best
# of benchmarks/results/gpu-ckpt-sweep-h100-rounds/). $OUT gets ckpt_pairs.txt and .json,
# machine.txt and build.txt.
set -u
ck=/var/tmp/ckpt
mkdir -p "$ck"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda
start=$SECONDS
. benchmarks/gpu_ckpt_prelude.sh
ckpt_prelude "${OUT:-/tmp}"
echo "=== ops built: exit $? at $((SECONDS - start)) s" >&2
python3 benchmarks/ckpt_pairs.py --target "$ck" --params "${PARAMS:-500M}" \
    --rounds "${ROUNDS:-5}" ${KNOBS:+--knobs "$KNOBS"} --out "${OUT:-/tmp}/ckpt_pairs.json" \
    2>&1 | tee "${OUT:-/tmp}/ckpt_pairs.txt"
echo "=== pairs: exit ${PIPESTATUS[0]} at $((SECONDS - start)) s" >&2
