# Source after gpu_env.sh on a GPU machine without libbpf: unpacks Debian 12's libbpf1 and
# libelf1 from .bpf/*.deb and puts them on the loader's path. That is all the libbpf backend
# of `iotune trace` needs: its BPF CO-RE object (bpf/reqsize.core.bpf.o) is prebuilt and
# libbpf relocates it to the running kernel's BTF; no compiler, no headers.
mkdir -p /tmp/bpf
for d in .bpf/*.deb; do dpkg -x "$d" /tmp/bpf; done
export LD_LIBRARY_PATH="/tmp/bpf/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
