#!/usr/bin/env bash
# benchmarks/sweep_aio.py on a GPU machine's 16 cores (the CI host has 2, too few for a
# RAM-backed target to be stable). From the repository root, after `. benchmarks/gpu_env.sh`,
# with .whl/, .debs/, gpu-ops/ (DeepSpeed's built async_io op) and .fio/ carried. .fio/
# holds an fio binary (statically linked: the machine has none and Debian's fio links
# Ceph, Gluster and RDMA libraries) and Debian 12's e2fsprogs .debs, unpacked only where
# the machine has no mkfs.ext4.
#     bash benchmarks/gpu_sweep_aio.sh start ARGS...   # sweep_aio.py ARGS in the background
#     bash benchmarks/gpu_sweep_aio.sh collect         # wait for it, copy the results to $OUT
# A run longer than one call's 10 minutes goes on in its own session between the calls.
set -u
out="${OUT:-/tmp/gpu-out}" work=/var/tmp/gpu-sweep-aio
case "${1:?start or collect}" in
start)
    shift
    rm -rf "$work"
    mkdir -p "$work"
    export TORCH_EXTENSIONS_DIR=/tmp/tx PYTHONUNBUFFERED=1 PATH="$PWD/.fio:$PATH"
    tar xzf gpu-ops/tx.tgz -C /tmp
    find /tmp/site/deepspeed -exec touch -h -d 2020-01-01 {} +
    if ! command -v mkfs.ext4 >/dev/null; then
        for d in .fio/*.deb; do dpkg -x "$d" /tmp/e2fs; done
        export PATH="/tmp/e2fs/sbin:$PATH" MKE2FS_CONFIG=/tmp/e2fs/etc/mke2fs.conf
        export LD_LIBRARY_PATH="/tmp/e2fs/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
    fi
    {
        echo "cores: $(nproc); kernel: $(uname -r); $(fio --version)"
        grep -E "MemTotal|MemAvailable" /proc/meminfo
        lscpu | grep -E "Model name|NUMA node\(s\)"
        command -v losetup mkfs.ext4
        python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)" 2>&1 | tail -1
    } > "$work/host.txt" 2>&1
    cat "$work/host.txt"
    setsid bash -c "python3 benchmarks/sweep_aio.py --keep $work/records $* \
        > $work/sweep_aio.txt 2> $work/sweep_aio.err; echo \$? > $work/rc" < /dev/null &
    ;;
collect)
    until [ -f "$work/rc" ]; do sleep 5; done
    echo "rc=$(cat "$work/rc")"
    tail -n 30 "$work/sweep_aio.err"
    cat "$work/sweep_aio.txt"
    mkdir -p "$out"
    cp "$work/host.txt" "$work/sweep_aio.txt" "$out/"
    tar czf "$out/records.tgz" -C "$work" records
    ;;
esac
