#!/usr/bin/env bash
# GPU tier: a checkpoint saved and resumed on the GPU machine, and iotune's check that the
# resumed run's first step continues the saving run's loss (bf16, on the GPU). From the
# repository root with .whl/, .debs/ and .bpf/ carried:
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_libbpf.sh; bash benchmarks/gpu_resume.sh
# PRESET (default opt_ram_1b): two steps saved after each, then one step resumed from the
# first save; $OUT gets each run's --json document and output.
set -u
preset="${PRESET:-opt_ram_1b}"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
mkdir -p /var/tmp/ckr /var/tmp/offr
start=$SECONDS
iot() { python3 -m iotune "$@"; }
iot --json run "$preset" --steps 2 --checkpoint-every 1 --checkpoint-dir /var/tmp/ckr/ck \
    --nvme-path /var/tmp/offr --force --out /tmp/res-saving > "$OUT/saving.json" 2> "$OUT/saving.err"
echo "=== saving: exit $? at $((SECONDS - start)) s" >&2
iot --json run "$preset" --steps 1 --resume-from /var/tmp/ckr/ck/step1 --nvme-path /var/tmp/offr \
    --out /tmp/res-resumed > "$OUT/resumed.json" 2> "$OUT/resumed.err"
echo "=== resumed: exit $? at $((SECONDS - start)) s" >&2
python3 - "$OUT" <<'PY' >&2
import json, sys
d = sys.argv[1]
s, r = (json.load(open(f"{d}/{n}.json")) for n in ("saving", "resumed"))
print("saving losses:", [e["loss"] for e in s["events"] if e["event"] == "step"])
print("resumed:", [e["loss"] for e in r["events"] if e["event"] == "step"], r["resume_check"])
print("notes:", [n for n in r["notes"] if n.startswith("resumed")])
PY
tail -3 "$OUT/resumed.err" >&2
