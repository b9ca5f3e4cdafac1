#!/usr/bin/env bash
# GPU tier: a run's checkpoints with each of DeepSpeed's writers, on one GPU, in one call of at
# most 10 minutes. From the repository root with .whl/, .debs/ and .bpf/ carried
# (benchmarks/gpu_carry.sh fills them):
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_libbpf.sh; bash benchmarks/gpu_checkpoints.sh
# PRESETS (default "opt_nvme_1b"): for each, one traced step and a save after it
# (`iotune trace --run P --steps 1 --checkpoint-every 1`) with the torch, fast and decoupled
# writers (WRITERS), the checkpoints on the machine's one disk beside the offload (--force).
# First the disk's own sequential rates (dd, O_DIRECT, 1 MiB blocks, 4 GiB), the ceiling a
# save's copy is measured against.
# $OUT gets checkpoints.tgz: every command's JSON and output, and a summary.
set -u
presets="${PRESETS:-opt_nvme_1b}"
writers="${WRITERS:-torch fast decoupled}"
out=/tmp/gpu-res/checkpoints
trap 'tar czf "${OUT:-/tmp}/checkpoints.tgz" -C /tmp/gpu-res checkpoints' EXIT
off=/var/tmp/offload
ck=/var/tmp/ckpt
mkdir -p "$out" "$off" "$ck"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 DS_ACCELERATOR=cuda
echo 512 > /sys/block/vda/queue/max_sectors_kb
start=$SECONDS
iot() { python3 -m iotune "$@"; }
{
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    nproc; free -g | head -2; lsblk -d -o NAME,SIZE,ROTA,MODEL; uname -r; df -h /var/tmp
} > "$out/machine.txt" 2>&1
python3 -c 'from deepspeed.ops.op_builder import AsyncIOBuilder, CPUAdamBuilder; AsyncIOBuilder().load(); CPUAdamBuilder().load()' \
    > "$out/build.txt" 2>&1
echo "=== ops built: exit $? at $((SECONDS - start)) s" >&2
dd if=/dev/zero of=/var/tmp/dd.bin bs=1M count=4096 oflag=direct 2> "$out/dd_write.txt"
dd if=/var/tmp/dd.bin of=/dev/null bs=1M iflag=direct 2> "$out/dd_read.txt"
rm -f /var/tmp/dd.bin
tail -q -n 1 "$out/dd_write.txt" "$out/dd_read.txt" >&2
for p in $presets; do
    for w in $writers; do
        rm -rf "${off:?}"/* "${ck:?}"/* "$out/$p-$w"
        sync
        iot --json trace --run "$p" --steps 1 --nvme-path "$off" --checkpoint-every 1 \
            --checkpoint-dir "$ck/$w" --checkpoint-writer "$w" --force --out "$out/$p-$w" \
            > "$out/$p-$w.json" 2> "$out/$p-$w.err"
        echo "=== $p $w: exit $? at $((SECONDS - start)) s" >&2
        tail -2 "$out/$p-$w.err" >&2
    done
done
python3 - "$presets" "$writers" <<'PY' | tee "$out/summary.txt" >&2
import json, sys
for p in sys.argv[1].split():
    for w in sys.argv[2].split():
        try:
            d = json.load(open(f"/tmp/gpu-res/checkpoints/{p}-{w}.json"))
        except (OSError, ValueError) as exc:
            print(p, w, "no result:", exc)
            continue
        ck = d.get("checkpoints") or {}
        for s in ck.get("saves", []):
            print(p, w, {k: s.get(k) for k in ("blocked_s", "durable_s", "files", "bytes",
                  "swap_copy_bytes", "read_bytes", "write_bytes", "write_gib_s")},
                  "estimate", ck.get("estimate"), "step_s",
                  [e.get("step_s") for e in d["events"] if e.get("event") == "step"])
PY
