#!/bin/sh
# Compiles bpf/reqsize.core.bpf.c into the CO-RE object the libbpf backend loads, and writes
# its sidecar: the sha256 of the sources it was built from and of the object, which
# iotune checks before loading it and the unit tier checks against the sources.
# Needs clang (14 or later, BPF target) and libbpf's headers (Debian: clang-14 libbpf-dev).
# Run from anywhere; the object is committed, so `iotune trace` needs neither.
set -eu
cd "$(dirname "$0")/.."
CLANG=${CLANG:-$(command -v clang-14 || command -v clang)}
arch=$(uname -m | sed 's/x86_64/x86/; s/aarch64/arm64/')
# relative paths and no build directory in the debug info: the same object wherever it is built
# -mcpu=v3: atomic fetch-and-add (the depth an issue finds; kernels from 5.12, as bi_bdev)
"$CLANG" -g -O2 -target bpf -mcpu=v3 -D__TARGET_ARCH_"$arch" \
    -I bpf -I /usr/include/"$(uname -m)"-linux-gnu \
    -fdebug-prefix-map="$PWD"=. -fdebug-compilation-dir=. \
    -c bpf/reqsize.core.bpf.c -o bpf/reqsize.core.bpf.o.tmp
mv bpf/reqsize.core.bpf.o.tmp bpf/reqsize.core.bpf.o
{
    echo "# sha256 of the sources and of the object built from them (bpf/build.sh)"
    sha256sum bpf/reqsize.core.bpf.c bpf/iotune.h bpf/reqsize.core.bpf.o
    echo "# $("$CLANG" --version | head -1)"
} > bpf/reqsize.core.bpf.sha256
echo "built bpf/reqsize.core.bpf.o"
