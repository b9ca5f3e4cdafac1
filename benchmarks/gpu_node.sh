#!/usr/bin/env bash
# GPU tier, one GPU's host (the device tool's nvidia-h200): CPU Adam with 1, 2 and 4 ranks at
# once on the GPU host's cores, measured against the planner's prediction from one rank's
# figure (benchmarks/adam_ranks.py), in one call of at most 10 minutes. From the repository
# root with .whl/ and .debs/ carried (benchmarks/gpu_carry.sh fills them):
#     . benchmarks/gpu_env.sh; bash benchmarks/gpu_node.sh [PARAMS] [ROUNDS]
# The host's memory for the planner's bound is its CPU's row of configs/cpus.toml where the
# model is there (one socket's), else 460.8 GB/s (a Genoa socket); the rounds print the
# memory's STREAM triad measured beside them. $OUT gets the output and the sweeps' records.
set -u
params="${1:-500M}" rounds="${2:-3}"
out="${OUT:-/tmp/gpu-out}"
res=/var/tmp/node
rm -rf "$res"
mkdir -p "$out" "$res"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
start=$SECONDS
save() { tar czf "$out/node.tgz" -C /var/tmp node; }
trap save EXIT
{
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    nproc; free -g | head -2; uname -r
    lscpu | grep -E "Model name|Socket|NUMA|Thread|Core|Flags" | cut -c1-400
    git log -1 --format=%h 2>/dev/null
} > "$out/machine.txt" 2>&1
python3 -c 'from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()' \
    > "$out/build.txt" 2>&1
echo "=== CPU Adam built: exit $? at $((SECONDS - start)) s" >&2
cores=$(nproc)
mem=$(python3 - <<'PY'
import re
from iotune.plan.cpus import load_cpus
model = next((l.split(":", 1)[1] for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
for key, spec in load_cpus().items():
    num = re.search(r"(\d{4}\+?)$", key)
    if num and num.group(1) in model:
        print(f"{spec.memory_bw / 1e9:.1f}GB/s")
        break
else:
    print("460.8GB/s")
PY
)
echo "cpu: cores=$cores,memory=$mem ($(grep -m1 'model name' /proc/cpuinfo))" | tee "$out/adam_ranks.txt" >&2
python3 benchmarks/adam_ranks.py --cpu "cores=$cores,memory=$mem" --params "$params" \
    --ranks 1,2,4 --repeats 3 --rounds "$rounds" --out "$res/adam" >> "$out/adam_ranks.txt" 2>&1
echo "=== adam_ranks: exit $? at $((SECONDS - start)) s" >&2
cat "$out/adam_ranks.txt" >&2
