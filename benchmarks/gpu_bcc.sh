# Source after gpu_env.sh on a GPU machine without bcc: unpacks Debian 12's bcc (libbpfcc,
# python3-bpfcc and the LLVM/clang libraries it links) and a Debian kernel-headers tree from
# .bcc/*.deb, and points bcc at them. iotune's programs use tracepoints only, whose layout
# bcc reads from the running kernel's tracefs, so headers of another kernel serve.
mkdir -p /tmp/bcc
for d in .bcc/*.deb; do dpkg -x "$d" /tmp/bcc; done
export LD_LIBRARY_PATH="/tmp/bcc/usr/lib/x86_64-linux-gnu:/tmp/bcc/usr/lib/llvm-14/lib:${LD_LIBRARY_PATH:-}"
export PYTHONPATH="${PYTHONPATH:-}:/tmp/bcc/usr/lib/python3/dist-packages"
kdir="/lib/modules/$(uname -r)"
if [ ! -e "$kdir/build/include/linux/kconfig.h" ]; then
    mkdir -p "$kdir"
    ln -sfn /tmp/bcc/usr/src/linux-headers-6.1.0-56-amd64 "$kdir/build"
    ln -sfn /tmp/bcc/usr/src/linux-headers-6.1.0-56-common "$kdir/source"
fi
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
