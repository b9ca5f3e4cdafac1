#!/usr/bin/env bash
# iotune set-up for a Debian/Ubuntu host, as root. Installs only what is missing, so a
# second run takes seconds.
#
#   scripts/setup.sh run    install, then run the main job: iotune doctor, then a traced
#                           offloaded training run (IOTUNE_PRESET, IOTUNE_NVME_PATH; extra
#                           arguments go to 'iotune trace --run', e.g. --steps 5)
#   scripts/setup.sh test   install (plus QEMU, a distribution kernel, virtme-ng), then run
#                           every CI test tier: unit, root, vm
#   scripts/setup.sh        install only
#
# Environment: PYTHON (interpreter for the virtualenv, default python3), VENV (default
# .venv in the checkout), IOTUNE_TORCH_INDEX (pip index for torch, default: a locally
# configured wheel, else PyTorch's CPU index on hosts without an NVIDIA GPU).
set -euo pipefail

mode="${1:-install}"
shift || true
case "$mode" in run|test|install) ;; *)
    echo "usage: scripts/setup.sh [run|test|install] [pytest args...]" >&2; exit 2 ;;
esac

top="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$top"
venv="${VENV:-$top/.venv}"
python="${PYTHON:-python3}"

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$1" >&2; [ -n "${2:-}" ] && printf 'hint: %s\n' "$2" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "scripts/setup.sh needs root (it installs packages and mounts tracefs)" \
    "run: sudo scripts/setup.sh $mode"
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian and Ubuntu" \
    "install the packages listed in docs/setup.md by hand, then 'pip install -e .[train]'"

. /etc/os-release
release="$(uname -r)"
# ccache: torch compiles DeepSpeed's ops through it, so a new virtualenv reuses the last one's
pkgs=(fio mdadm xfsprogs e2fsprogs util-linux mount libaio-dev g++ ccache libbpf1
      python3-venv kmod udev procps)
# The tracer: libbpf's CO-RE object where the kernel has BTF, with no compiler or headers.
# bcc (LLVM, and the kernel's headers) where the kernel has no BTF, and for the test tiers,
# which count with both and compare them.
want_bcc=no
if [ "$mode" = test ] || [ ! -e /sys/kernel/btf/vmlinux ]; then
    want_bcc=yes
    pkgs+=(bpfcc-tools python3-bpfcc bpftool)
fi
if [ "$mode" = test ]; then
    # vm tier: a QEMU guest booting a distribution kernel (which has md and nvme modules);
    # the fresh-root test: mmdebstrap; benchmarks/trace_overhead.py: bpftrace, blktrace;
    # the latency tests: bcc's biolatency, built with libbpf (libbpf-tools);
    # the report test opens report.html in headless chromium; the fabrics test connects the
    # guest's own NVMe-oF target with nvme-cli, and its RDMA one over soft-RoCE with
    # iproute2's ip and rdma; the nodes test: DeepSpeed's pdsh launcher logging in with ssh
    # to two nodes (network namespaces) that each run their own sshd
    pkgs+=(qemu-system-x86 busybox-static mmdebstrap bpftrace blktrace libbpf-tools chromium nvme-cli)
    pkgs+=(iproute2 pdsh openssh-client openssh-server)
    case "${ID:-}" in ubuntu) pkgs+=(linux-image-generic) ;; *) pkgs+=(linux-image-amd64) ;; esac
fi

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done

# Kernel headers for bcc: the running kernel's own package if the distribution has one;
# otherwise the distribution's generic headers, linked below (see docs/setup.md).
headers_dir="/lib/modules/$release/build"
link_headers=no
if [ "$want_bcc" = yes ] && [ ! -e "$headers_dir/include" ] && [ ! -e /sys/kernel/kheaders.tar.xz ]; then
    if [ -z "$(apt-cache policy "linux-headers-$release" 2>/dev/null | grep -E 'Candidate: [0-9]')" ] \
       && [ "${#missing[@]}" -gt 0 ]; then
        apt-get update -q >&2
    fi
    if apt-cache policy "linux-headers-$release" 2>/dev/null | grep -qE 'Candidate: [0-9]'; then
        missing+=("linux-headers-$release")
    else
        case "${ID:-}" in ubuntu) generic=linux-headers-generic ;; *) generic=linux-headers-amd64 ;; esac
        dpkg-query -W -f='${Status}' "$generic" 2>/dev/null | grep -q "ok installed" || missing+=("$generic")
        link_headers=yes
    fi
fi

if [ "${#missing[@]}" -gt 0 ]; then
    say "installing: ${missing[*]}"
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

if [ "$link_headers" = yes ]; then
    # bcc compiles against /lib/modules/$(uname -r)/build. A kernel without a headers
    # package (cloud and micro-VM kernels) can borrow the distribution's: the tracepoint
    # structs bcc uses are generated from the running kernel's tracefs format files, so
    # their layout is right; kprobes on kernel structs would not be.
    # A glob that matches nothing stays literal without nullglob; only one of the two
    # flavours exists on a host (Debian: -amd64, Ubuntu: -generic), so filter by -d.
    hdr=""
    for d in /usr/src/linux-headers-*-amd64 /usr/src/linux-headers-*-generic; do
        if [ -d "$d/include" ]; then hdr="$(printf '%s\n%s\n' "$hdr" "$d" | sort -V | tail -n 1)"; fi
    done
    [ -n "$hdr" ] || die "no kernel headers found under /usr/src" "apt-get install $generic"
    # the flavour tree's sources: Debian's ...-common, Ubuntu's tree without the flavour
    common=""
    for c in "${hdr%-amd64}-common" "${hdr%-generic}"; do
        if [ "$c" != "$hdr" ] && [ -d "$c" ]; then common="$c"; fi
    done
    mkdir -p "/lib/modules/$release"
    ln -sfn "$hdr" "/lib/modules/$release/build"
    if [ -n "$common" ]; then ln -sfn "$common" "/lib/modules/$release/source"; fi
    say "linked $hdr as the headers of kernel $release (for bcc tracepoint programs)"
fi

if [ ! -d /sys/kernel/tracing/events ] && [ ! -d /sys/kernel/debug/tracing/events ]; then
    mount -t tracefs nodev /sys/kernel/tracing
    say "mounted tracefs at /sys/kernel/tracing"
fi

if [ ! -x "$venv/bin/python" ]; then
    say "creating virtualenv $venv with $python"
    "$python" -m venv "$venv"
fi
purelib="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# bcc is not on PyPI: its Python half is pure Python over libbcc.so from python3-bpfcc.
# Link just that package into the virtualenv (not all of the system's site-packages).
if [ ! -e "$purelib/bcc" ] && [ -d /usr/lib/python3/dist-packages/bcc ]; then
    ln -sfn /usr/lib/python3/dist-packages/bcc "$purelib/bcc"
    say "linked the system bcc module into the virtualenv"
fi

extras=train
[ "$mode" = test ] && extras=train,dev
stamp="$venv/.iotune-installed"
want="$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16) $extras"
have="$(cat "$stamp" 2>/dev/null || true)"
# an install with the dev extra serves 'run' too: no reinstall when switching modes
if [ "$have" = "${want% *} train,dev" ]; then want="$have"; fi
if [ "$have" != "$want" ]; then
    pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
    if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
        if [ -n "${IOTUNE_TORCH_INDEX:-}" ]; then
            "${pip[@]}" torch --index-url "$IOTUNE_TORCH_INDEX" >&2
        elif command -v nvidia-smi >/dev/null || [ -e /proc/driver/nvidia ]; then
            say "NVIDIA GPU present: installing the default (CUDA) torch"
            "${pip[@]}" torch >&2
        elif "${pip[@]}" --no-index --no-deps torch==2.13.0 >/dev/null 2>&1; then
            # a CPU wheel configured locally (pip's find-links); its dependencies from the index
            "${pip[@]}" torch==2.13.0 >&2
            say "installed torch 2.13.0 from a locally configured CPU wheel"
        else
            say "no GPU: installing the CPU build of torch (no CUDA download)"
            "${pip[@]}" torch --index-url https://download.pytorch.org/whl/cpu >&2
        fi
    fi
    say "installing iotune[$extras] into $venv"
    "${pip[@]}" -e ".[$extras]" >&2
    echo "$want" > "$stamp"
fi
ln -sfn "$venv/bin/iotune" /usr/local/bin/iotune
# iotune's own bytecode, written now: an editable install compiles none, and where
# PYTHONDONTWRITEBYTECODE is set no import writes it, so every command would compile the
# modules it imports again (0.50 s against 0.36 s for 'iotune estimate' on an AVX2 host;
# fifty times that in the vm tier's emulated guests)
"$venv/bin/python" -m compileall -q -x '/(data|\.venv|\.git)/' iotune tests >/dev/null

case "$mode" in
    run)
        iotune doctor
        # The main job: a traced offloaded training run. A host with a CUDA GPU runs the 1B
        # preset with its optimizer state on NVMe; any other host the tiny CPU preset
        # (DS_ACCELERATOR=cpu). The offload directory must be on a drive; by default a
        # scratch directory on the root filesystem, IOTUNE_NVME_PATH names another.
        preset="${IOTUNE_PRESET:-}"
        if [ -z "$preset" ]; then
            if "$venv/bin/python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
                preset=opt_nvme_1b
            else
                preset=tiny_opt_nvme
            fi
        fi
        nvme="${IOTUNE_NVME_PATH:-/var/tmp/iotune-offload}"
        mkdir -p "$nvme"
        exec iotune trace --run "$preset" --nvme-path "$nvme" "$@"
        ;;
    test)
        exec "$venv/bin/python" -m pytest -m "unit or root or vm" --durations=40 "$@"
        ;;
esac
