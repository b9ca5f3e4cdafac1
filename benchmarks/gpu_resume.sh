#!/usr/bin/env bash
# GPU tier: a checkpoint saved and resumed on the GPU machine, and iotune's check that each
# resumed step the saving run also trained continues its loss (bf16, on the GPU). From the
# repository root with .whl/, .debs/ and .bpf/ carried:
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_libbpf.sh; bash benchmarks/gpu_resume.sh
# PRESET (default opt_ram_1b): SAVE_STEPS steps (default 2) saved after each, then
# RESUME_STEPS steps (default 1) resumed from the first save; SETS: --set options for both
# (e.g. "--set model.num_hidden_layers=4"); $OUT gets each run's --json document and output.
set -u
preset="${PRESET:-opt_ram_1b}"
save_steps="${SAVE_STEPS:-2}"
resume_steps="${RESUME_STEPS:-1}"
read -r -a sets <<< "${SETS:-}"
export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1
mkdir -p /var/tmp/ckr /var/tmp/offr
start=$SECONDS
iot() { python3 -m iotune "$@"; }
iot --json run "$preset" "${sets[@]}" --steps "$save_steps" --checkpoint-every 1 --checkpoint-dir /var/tmp/ckr/ck \
    --nvme-path /var/tmp/offr --force --out /tmp/res-saving > "$OUT/saving.json" 2> "$OUT/saving.err"
echo "=== saving: exit $? at $((SECONDS - start)) s" >&2
iot --json run "$preset" "${sets[@]}" --steps "$resume_steps" --resume-from /var/tmp/ckr/ck/step1 --nvme-path /var/tmp/offr \
    --out /tmp/res-resumed > "$OUT/resumed.json" 2> "$OUT/resumed.err"
echo "=== resumed: exit $? at $((SECONDS - start)) s" >&2
python3 - "$OUT" <<'PY' >&2
import json, sys
d = sys.argv[1]
s, r = (json.load(open(f"{d}/{n}.json")) for n in ("saving", "resumed"))
print("saving losses:", [e["loss"] for e in s["events"] if e["event"] == "step"])
print("resumed:", [e["loss"] for e in r["events"] if e["event"] == "step"], r["resume_check"])
print("init:", [{k: e.get(k) for k in ("adam_restored", "resumed_at")} for e in r["events"] if e["event"] == "init"])
print("tables:", [(t["case"], t.get("read_bytes"), t.get("write_bytes")) for t in r["table"] + r["estimate_table"]])
print("notes:", [n for n in r["notes"] if n.startswith("resumed")])
PY
tail -3 "$OUT/resumed.err" >&2
