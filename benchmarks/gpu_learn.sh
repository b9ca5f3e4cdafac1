#!/usr/bin/env bash
# GPU tier: a user's script traced with nothing told but the command. `iotune trace -- COMMAND`
# learns the DeepSpeed config, world size, batch, dtype and model from the launched processes
# and puts the I/O model beside every step, with no --model, --ds-config, --micro-batch, --ga
# or --set. From the repository root with .whl/ (accelerate among the wheels), .debs/ and .bpf/
# carried (benchmarks/gpu_carry.sh fills them):
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_libbpf.sh; bash benchmarks/gpu_learn.sh
# 1. `accelerate launch --config_file acc.yaml`, DeepSpeed set up in accelerate's YAML (ZeRO-3,
#    optimizer state on NVMe, bf16; no DeepSpeed JSON), tests/data/custom/accel_script.py on the
#    Starcoder2-style 315M model, 4 steps.
# 2. A transformers.Trainer script with the Trainer's ZeRO-3 NVMe config full of "auto"
#    (tests/data/custom/hf_zero3_nvme.json), micro-batch 4, accumulation 2, bf16, 4 steps.
# 3. Lightning's DeepSpeed strategy (tests/data/custom/lightning_script.py): ZeRO-3, optimizer
#    state on NVMe through the strategy's own arguments, CPU Adam, bf16-mixed, 4 steps.
# $OUT gets learn.tgz (each trace's JSON, stderr and run folder) and learn.txt (the rows).
set -u
out=/tmp/gpu-res/learn
trap 'tar czf "${OUT:-/tmp}/learn.tgz" -C /tmp/gpu-res learn; cp "$out/learn.txt" "${OUT:-/tmp}/" 2>/dev/null' EXIT
off=/var/tmp/offload
mkdir -p "$out" "$off"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda
echo 512 > /sys/block/vda/queue/max_sectors_kb
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$out/learn.txt"
python3 -c 'from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder; AsyncIOBuilder().load(); CPUAdamBuilder().load()' \
    > "$out/build.txt" 2>&1
echo "=== ops built: exit $? at $((SECONDS - start)) s" >&2
model=tests/data/custom/starcoder2_320m
show() {
    python3 - "$1" <<'PY' >> "$out/learn.txt"
import json, sys
name = sys.argv[1]
d = json.load(open(f"/tmp/gpu-res/learn/{name}.json"))
s, learned = d["script"], d.get("learned") or {}
run = learned.get("run") or {}
print(f"== {name}: estimate from {s.get('estimate_from')}, N = {s.get('params'):,}, steps found "
      f"{s['steps_found']}, late cuts {s['late_cuts']}")
print("   run: " + ", ".join(f"{k}={run.get(k)}" for k in (
    "world_size", "micro_batch", "ga", "dtype", "optimizer_nvme_path", "architecture")))
for n in learned.get("notes") or []:
    print(f"   note: {n}")
for r in s["rows"]:
    m, p = r["measured"], r["predicted"]
    dr = (m["read"] - p["read"]) / p["read"] * 100 if p["read"] else 0.0
    dw = (m["write"] - p["write"]) / p["write"] * 100 if p["write"] else 0.0
    print(f"   {r['label']:8} read {m['read']:>14,} predicted {p['read']:>14,} ({dr:+.3f}%)  "
          f"write {m['write']:>14,} predicted {p['write']:>14,} ({dw:+.3f}%)")
PY
}

rm -rf "${off:?}"/*
cat > "$out/acc.yaml" <<EOF
compute_environment: LOCAL_MACHINE
debug: false
deepspeed_config:
  gradient_accumulation_steps: 1
  gradient_clipping: 1.0
  offload_optimizer_device: nvme
  offload_optimizer_nvme_path: $off
  offload_param_device: none
  zero3_init_flag: false
  zero_stage: 3
distributed_type: DEEPSPEED
downcast_bf16: 'no'
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 1
rdzv_backend: static
same_network: true
use_cpu: false
EOF
# accelerate launch does not hand the YAML's nvme path to DeepSpeed (it swaps to ./none under
# the folder the command starts in): start it on the offload volume, as a user would learn to
(cd "$off" && python3 -m iotune --json trace --target "$off" --out "$out/accelerate" -- \
    python3 -m accelerate.commands.launch --config_file "$out/acc.yaml" \
    "$OLDPWD/tests/data/custom/accel_script.py" "$OLDPWD/$model" 4 1024 4) \
    > "$out/accelerate.json" 2> "$out/accelerate.err"
echo "=== accelerate launch with a YAML: exit $? at $((SECONDS - start)) s" >&2
show accelerate
# the same again, its libraries now in the page cache: the offload folder shares the root disk
# with python's and CUDA's libraries, and a launched process's first reads of them are its own
rm -rf "${off:?}"/*
(cd "$off" && python3 -m iotune --json trace --target "$off" --out "$out/accelerate_again" -- \
    python3 -m accelerate.commands.launch --config_file "$out/acc.yaml" \
    "$OLDPWD/tests/data/custom/accel_script.py" "$OLDPWD/$model" 4 1024 4) \
    > "$out/accelerate_again.json" 2> "$out/accelerate_again.err"
echo "=== accelerate again: exit $? at $((SECONDS - start)) s" >&2
show accelerate_again

rm -rf "${off:?}"/*
python3 - <<'PY'
import json
c = json.load(open("tests/data/custom/hf_zero3_nvme.json"))
c["zero_optimization"]["offload_optimizer"]["nvme_path"] = "/var/tmp/offload/hf"
json.dump(c, open("/tmp/gpu-res/learn/hf_ds.json", "w"), indent=2)
PY
python3 -m iotune --json trace --target "$off" --out "$out/trainer" -- \
    python3 tests/data/custom/trainer_script.py "$model" "$out/hf_ds.json" 4 1024 4 2 \
    > "$out/trainer.json" 2> "$out/trainer.err"
echo "=== Trainer with auto: exit $? at $((SECONDS - start)) s" >&2
show trainer

rm -rf "${off:?}"/*
python3 -m iotune --json trace --target "$off" --out "$out/lightning" -- \
    python3 tests/data/custom/lightning_script.py "$model" "$off/lightning" 4 1024 4 \
    > "$out/lightning.json" 2> "$out/lightning.err"
echo "=== Lightning's DeepSpeed strategy: exit $? at $((SECONDS - start)) s" >&2
show lightning
cat "$out/learn.txt" >&2
