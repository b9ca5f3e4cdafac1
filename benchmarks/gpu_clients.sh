#!/usr/bin/env bash
# GPU tier: what users bring, on one GPU, in one call of at most 10 minutes. From the
# repository root with .whl/ (accelerate among the wheels), .debs/ and .bpf/ carried
# (benchmarks/gpu_carry.sh fills them):
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_libbpf.sh; bash benchmarks/gpu_clients.sh
# 1. A plain DeepSpeed script of a user's (tests/data/custom/train_script.py: zero.Init,
#    deepspeed.initialize, 4 steps) under torchrun, a Starcoder2-style model of 314.9M
#    parameters in 4 optimizer sub-groups (sub_group_size 1e8), the optimizer state on the
#    machine's disk (benchmarks/gpu_script_ds.json): `iotune trace --model --ds-config --`,
#    the steps the swap folder's writes show against the script's 4.
# 2. A transformers.Trainer script given the Trainer's ZeRO-3 NVMe config full of "auto"
#    (tests/data/custom/hf_zero3_nvme.json, its aio.thread_count included), accumulation 2,
#    bf16: the values iotune fills, and the Trainer's optimizer steps found.
# 3. `iotune run opt_nvme_1b --steps 3` (the optimizer swapper's swaps timed per step), then
#    `iotune estimate --baseline RUN --drives 1,2,4` from that run alone, and with the disk
#    described by a datasheet.
# PARTS (default "script trainer run") picks which of the three run.
# $OUT gets clients.tgz: every command's JSON, output and run folder.
set -u
parts="${PARTS:-script trainer run}"
want() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
out=/tmp/gpu-res/clients
trap 'tar czf "${OUT:-/tmp}/clients.tgz" -C /tmp/gpu-res clients' EXIT
off=/var/tmp/offload
mkdir -p "$out" "$off"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda
echo 512 > /sys/block/vda/queue/max_sectors_kb
start=$SECONDS
iot() { python3 -m iotune "$@"; }
{
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    nproc; free -g | head -2; lsblk -d -o NAME,SIZE,ROTA,MODEL; uname -r
} > "$out/machine.txt" 2>&1
# DeepSpeed's ops built once, outside the timed runs
python3 -c 'from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder; AsyncIOBuilder().load(); CPUAdamBuilder().load()' \
    > "$out/build.txt" 2>&1
echo "=== ops built: exit $? at $((SECONDS - start)) s" >&2

model=tests/data/custom/starcoder2_320m
if want script; then
rm -rf "${off:?}"/*
iot --json trace --model "$model" --ds-config benchmarks/gpu_script_ds.json --seq-len 1024 \
    --out "$out/script" -- python3 -m torch.distributed.run --nproc_per_node 1 \
    tests/data/custom/train_script.py "$model" benchmarks/gpu_script_ds.json 4 1024 \
    > "$out/script.json" 2> "$out/script.err"
echo "=== script under torchrun: exit $? at $((SECONDS - start)) s" >&2
python3 - <<'PY' >&2
import json
d = json.load(open("/tmp/gpu-res/clients/script.json"))["script"]
print("steps found", d["steps_found"], "late cuts", d["late_cuts"], "events lost", d["events_lost"])
for r in d["rows"]:
    m, p = r["measured"], r["predicted"]
    print(r["label"], "read", m["read"], "pred", p["read"], "write", m["write"], "pred", p["write"])
PY
fi

if want trainer; then
rm -rf "${off:?}"/*
python3 - <<'PY'
import json
c = json.load(open("tests/data/custom/hf_zero3_nvme.json"))
c["zero_optimization"]["offload_optimizer"]["nvme_path"] = "/var/tmp/offload/hf"
json.dump(c, open("/tmp/gpu-res/clients/hf_ds.json", "w"), indent=2)
PY
iot --json trace --model "$model" --ds-config "$out/hf_ds.json" --seq-len 1024 \
    --micro-batch 4 --ga 2 --set dtype=bf16 --out "$out/trainer" -- \
    python3 tests/data/custom/trainer_script.py "$model" "$out/hf_ds.json" 4 1024 4 2 \
    > "$out/trainer.json" 2> "$out/trainer.err"
echo "=== Trainer with auto: exit $? at $((SECONDS - start)) s" >&2
python3 - <<'PY' >&2
import json
d = json.load(open("/tmp/gpu-res/clients/trainer.json"))["script"]
print("steps found", d["steps_found"], "late cuts", d["late_cuts"])
for r in d["rows"]:
    m, p = r["measured"], r["predicted"]
    print(r["label"], "read", m["read"], "pred", p["read"], "write", m["write"], "pred", p["write"])
PY
grep -A3 "auto " "$out/trainer.err" | head -3 >&2
fi

if want run; then
rm -rf "${off:?}"/*
iot --json run opt_nvme_1b --steps 3 --nvme-path "$off" --out "$out/r1b" \
    > "$out/run_1b.json" 2> "$out/run_1b.err"
echo "=== run opt_nvme_1b: exit $? at $((SECONDS - start)) s" >&2
iot estimate opt_nvme_1b --baseline "$out/r1b" --drives 1,2,4 > "$out/plan_run.txt" 2>&1
iot estimate opt_nvme_1b --baseline "$out/r1b" --drives 1,2,4 \
    --drive 'read=2.0GB/s,write=2.0GB/s,capacity=100GB,tbw=100TB' > "$out/plan_sheet.txt" 2>&1
echo "=== plans: exit $? at $((SECONDS - start)) s" >&2
grep -E "^ +[0-9]|step s|STEP" "$out/plan_run.txt" >&2
python3 - <<'PY' >&2
import json
d = json.load(open("/tmp/gpu-res/clients/run_1b.json"))
for e in d["events"]:
    if e.get("event") == "step":
        print({k: e.get(k) for k in ("step", "forward_s", "backward_s", "optimizer_s",
                                     "grad_out_s", "backward_grad_out_s", "swap_in_s",
                                     "grad_flush_s", "swap_out_s")})
PY
fi
