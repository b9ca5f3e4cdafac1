#!/usr/bin/env bash
# GPU tier, issue runs of the study's presets: each traced (bcc), its JSON document kept in
# $OUT. From the repository root of a GPU machine, with .whl/, .debs/, .bcc/ carried
# (benchmarks/gpu_carry.sh fills them here):
#     . benchmarks/gpu_env.sh; . benchmarks/gpu_bcc.sh; bash benchmarks/gpu_study.sh GROUP
# The offload directory is on the machine's one virtio disk, limited to 512 KiB requests like
# the study's NVMe drives.
set -u
group="${1:?group: 1b-a, 1b-b or 3b}"
out="${OUT:-/tmp/gpu-out}"
off=/var/tmp/offload
mkdir -p "$out" "$off"
echo 512 > /sys/block/vda/queue/max_sectors_kb
export PYTHONUNBUFFERED=1
run() {  # NAME ARGS...: one traced run, its document in $OUT/NAME.json, its table on stderr
    local name="$1"; shift
    echo "=== $name: iotune trace --run $*" >&2
    local t0=$SECONDS
    python3 -m iotune --json trace --run "$@" --out "/var/tmp/runs/$name" > "$out/$name.json"
    echo "=== $name: exit $? after $((SECONDS - t0)) s" >&2
    python3 -c "import json,sys; from rich.console import Console; from iotune.train.render import print_run; print_run(Console(stderr=True, width=200), json.load(open(sys.argv[1])))" "$out/$name.json" || true
}
python3 -m iotune doctor --build-ops --for train > "$out/doctor.txt" 2>&1 || { cat "$out/doctor.txt"; exit 1; }
case "$group" in
    1b-a)
        run opt_nvme_1b opt_nvme_1b --nvme-path "$off" --steps 3
        run params_opt_nvme_1b params_opt_nvme_1b --nvme-path "$off" --steps 2
        run opt_ram_1b opt_ram_1b --steps 3
        ;;
    1b-b)
        run opt_ram_zenflow_1b opt_ram_zenflow_1b --steps 8
        run opt_nvme_zenflow_1b opt_nvme_zenflow_1b --nvme-path "$off" --steps 8
        run opt_raid0_zenflow_1b opt_raid0_zenflow_1b --nvme-path "$off" --steps 4 --force
        # ZenFlow told to use NVMe at stage 2 (iotune refuses it): does it touch the drive?
        python3 benchmarks/zenflow_stage2_nvme.py /var/tmp/runs/z2 "$off/z2" 8
        python3 -m iotune --json trace --devices vda --out /var/tmp/runs/z2/trace -- \
            python3 -m iotune.workers.train /var/tmp/runs/z2/spec.json > "$out/zenflow_stage2_nvme.json"
        echo "=== zenflow stage 2 nvme: exit $?; swap dir:" >&2; du -sb "$off/z2" >&2
        ;;
    3b)
        run opt_nvme_3b opt_nvme_3b --nvme-path "$off" --steps 2
        run opt_ram_3b opt_ram_3b --steps 2
        run opt_nvme_zenflow_3b opt_nvme_zenflow_3b --nvme-path "$off" --steps 4
        run opt_ram_zenflow_3b opt_ram_zenflow_3b --steps 4
        ;;
esac
