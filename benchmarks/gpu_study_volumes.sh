#!/usr/bin/env bash
# GPU tier, the RAID0 study's pipeline on one GPU machine (tests/vm/test_study_vm.py runs it
# whole in the vm guest): first whether this kernel can build an md array at all, then the
# single-drive half on the machine's one disk: sweep-aio at the presets' aio block with the
# swap rehearsal of opt_nvme_1b, a study of opt_ram_1b, opt_nvme_1b and params_opt_nvme_1b over
# that one volume, the report, and the drives planner (estimate --drives) from that sweep and
# the study's opt_ram run, beside the measured steps. In calls of at most 10 minutes, each on
# a fresh machine: from the repository root, with .whl/, .debs/, .bcc/ carried
# (benchmarks/gpu_carry.sh fills them) and, after the first call, gpu-state/ (the previous
# call's vstudy.tgz unpacked there):
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_bcc.sh; bash benchmarks/gpu_study_volumes.sh SECONDS
# The study is stopped with SIGINT after SECONDS and resumed by the next call.
set -u
budget="${1:-540}"
out="${OUT:-/tmp/gpu-out}"
off=/var/tmp/offload
res=/var/tmp/vstudy
mkdir -p "$out" "$off" "$res"
echo 512 > /sys/block/vda/queue/max_sectors_kb
export PYTHONUNBUFFERED=1
start=$SECONDS
if [ -d gpu-state/vstudy ]; then cp -a gpu-state/vstudy/. "$res/"; fi
left() { echo $((budget - (SECONDS - start))); }
save() { tar czf "$out/vstudy.tgz" -C /var/tmp --exclude='*.npy' --exclude='iotune-swap-*' vstudy; }
trap save EXIT
iot() { python3 -m iotune "$@"; }
log="$out/log.txt"

{
    echo "=== md on this kernel ($(uname -r))"
    modprobe raid0 2>&1 || echo "modprobe raid0: failed"
    if [ -e /proc/mdstat ]; then cat /proc/mdstat; else echo "no /proc/mdstat: no md driver"; fi
    ls /sys/module | grep -E '^(md_mod|raid0)$' || echo "md_mod, raid0: not loaded"
    lsblk -d -o NAME,SIZE,ROTA,TRAN,MODEL
} >> "$log" 2>&1

iot doctor --build-ops --for train >> "$log" 2>&1 || { tail -30 "$log"; exit 1; }
if [ ! -f "$res/sweep/result.json" ]; then
    rm -rf "$res/sweep"
    iot sweep-aio --target "$off" --block-size 512K --queue-depth 8 --threads 1 \
        --single-submit false --overlap-events true --io-size 2G --repeats 2 --strategy grid \
        --no-fio --swap-pattern opt_nvme_1b --swap-rounds 1 --out "$res/sweep" >> "$log" 2>&1
    echo "=== sweep-aio: exit $? at $((SECONDS - start)) s" >> "$log"
fi
study=(study --presets opt_ram_1b,opt_nvme_1b,params_opt_nvme_1b --steps 3
       --volume "single=$off,aio=$res/sweep" --force --out "$res/study")
[ -f "$res/study/study.json" ] && study=(study --resume "$res/study")
timeout -s INT "$(left)" python3 -m iotune "${study[@]}" >> "$log" 2>&1
echo "=== study: exit $? at $((SECONDS - start)) s" >> "$log"
if grep -q params_opt_nvme_1b "$res/study/runs.jsonl" 2>/dev/null; then
    iot report "$res/study" "$res/sweep" --out "$res/report" --format md >> "$log" 2>&1
    cp "$res/report/report.md" "$res/study/runs.jsonl" "$out/"
    for s in opt_nvme_1b params_opt_nvme_1b; do
        echo "=== $s on K drives like the swept one" >> "$log"
        iot estimate "$s" --aio-config "$res/sweep" --baseline "$res/study/runs/opt_ram_1b" \
            --drives 1,2,3,4 >> "$log" 2>&1
    done
fi
