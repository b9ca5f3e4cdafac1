#!/usr/bin/env bash
# GPU tier: latency and queue depth (issue 46's GPU goal) on the GPU host's drive, in one call
# of at most 10 minutes. From the repository root with .whl/, .debs/ and .bpf/ carried
# (benchmarks/gpu_carry.sh fills them; .bpf/ holds libbpf-tools for bcc's biolatency):
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_libbpf.sh; bash benchmarks/gpu_latency.sh
# 1. `iotune trace --run opt_nvme_1b --steps 3` (libbpf; the kernel's BPF statistics on, so
#    the run records its programs' time), bcc's biolatency -D beside it.
# 2. A small `iotune sweep-aio` grid on the offload directory, then `iotune report` of both.
# (The programs' cost per request is measured on a CPU host: benchmarks/latency_cost.py.)
# $OUT gets latency.tgz: every command's JSON and output, the report, and a summary.
set -u
out=/tmp/gpu-res/latency
trap 'tar czf "${OUT:-/tmp}/latency.tgz" -C /tmp/gpu-res latency' EXIT
off=/var/tmp/offload
mkdir -p "$out" "$off"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda
start=$SECONDS
iot() { python3 -m iotune "$@"; }
{
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    nproc; free -g | head -2; lsblk -d -o NAME,SIZE,ROTA,MODEL; uname -r
    cat /sys/block/vda/queue/scheduler
} > "$out/machine.txt" 2>&1
python3 -c 'from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder; AsyncIOBuilder().load(); CPUAdamBuilder().load()' \
    > "$out/build.txt" 2>&1 &
build=$!
sysctl -qw kernel.bpf_stats_enabled=1
wait $build
echo "=== ops built: exit $? at $((SECONDS - start)) s" >&2
bl=/tmp/bpf/usr/sbin/biolatency
stdbuf -oL "$bl" -D -d vda > "$out/biolatency.txt" 2>&1 &
blpid=$!
sleep 2
iot --json trace --run opt_nvme_1b --steps 3 --nvme-path "$off" --out "$out/run" \
    > "$out/run.json" 2> "$out/run.err"
echo "=== trace --run: exit $? at $((SECONDS - start)) s" >&2
kill -INT $blpid
wait $blpid
tail -3 "$out/run.err" >&2
rm -rf "${off:?}"/*
iot --json sweep-aio --target "$off" --block-size 128K,1M --queue-depth 1,8,32 --threads 1 \
    --single-submit false --overlap-events true --ops read,write --io-size 512M --repeats 1 \
    --strategy grid --no-fio --out "$out/sweep" > "$out/sweep.json" 2> "$out/sweep.err"
echo "=== sweep-aio: exit $? at $((SECONDS - start)) s" >&2
iot report "$out/sweep" "$out/run" --out "$out/report" > "$out/report.txt" 2>&1
sysctl -qw kernel.bpf_stats_enabled=0
python3 - "$out" <<'PY' | tee "$out/summary.txt" >&2
import json, re, sys
from iotune.trace import latency as lt
out = sys.argv[1]
try:
    run = json.load(open(f"{out}/run.json"))
except (OSError, ValueError) as exc:
    sys.exit(f"run: no result: {exc}")
print("run exit", run["exit_code"], "steps", run["steps_done"], "checks", [c["summary"] for c in run["diskstats_check"]])
bt = run.get("bpf_time") or {}
reqs = sum(s[op]["requests"] or 0 for s in run["io_steps"] for op in ("read", "write"))
print("BPF time", bt, "ns per read/write request of the steps (upper bound):", bt.get("run_time_ns", 0) // max(reqs, 1))
for s in run["io_steps"]:
    for name, per in (s.get("drives") or {}).items():
        lat = per.get("latency") or {}
        print(s["label"], name, {op: lat.get(op) and {k: lat[op][k] for k in ("requests", "p50_us", "p99_us", "max_us")} for op in ("read", "write")}, "in flight", lat.get("depth", {}).get("mean"), "kernel", lat.get("depth", {}).get("kernel_mean"))
whole = (run.get("latency") or {}).get("vda") or {}
ours = {}
for op in ("read", "write"):
    for cls in lt.CLASSES:
        for k, v in (((whole.get(op) or {}).get(cls) or {}).get("histogram") or {}).items():
            us = int(lt.slot_value(int(k)) // 1000)
            b = max(0, us.bit_length() - 1)
            ours[b] = ours.get(b, 0) + v
theirs, disk = {}, None
for line in open(f"{out}/biolatency.txt"):
    m = re.match(r"\s*disk = (\S+)", line)
    if m:
        disk = m.group(1)
    m = re.match(r"\s*(\d+) -> (\d+)\s*:\s*(\d+)", line)
    if m and disk == "vda":
        theirs[(int(m.group(2)) + 1).bit_length() - 2] = int(m.group(3))
print("biolatency vda (over its longer window) vs the run's:", {b: (theirs.get(b, 0), ours.get(b, 0)) for b in sorted(set(ours) | set(theirs))})
PY
