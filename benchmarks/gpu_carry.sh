#!/usr/bin/env bash
# Fills the folders a GPU machine needs (it has torch and transformers, nothing else, and no
# network), from this Debian host's package registries, in the repository root:
#   .whl/   DeepSpeed 0.19.8 (pure Python, built here) and the cp312 wheels it needs
#   .debs/  libaio1, libaio-dev (DeepSpeed builds its async_io op against them)
#   .bpf/   libbpf1 and libelf1: all that `iotune trace` needs there (its CO-RE object is in
#           bpf/, prebuilt), well under 1 MB
#   .xfs/   xfsprogs, libinih1, liburcu8: mkfs.xfs for the reflink measures (gpu_swapcopy.sh)
#   .bcc/   only with IOTUNE_CARRY_BCC=1, to compare with bcc: bcc 0.26 (libbpfcc,
#           python3-bpfcc, libbpf1) with the LLVM 14 libraries it links, and Debian 12's 6.1
#           kernel headers (bcc compiles tracepoint programs against them), about 52 MB
# Then name them in the device call's carry: [".whl", ".debs", ".bpf"], and source
# benchmarks/gpu_env.sh and benchmarks/gpu_libbpf.sh there (gpu_bcc.sh for .bcc).
set -euo pipefail
cd "$(dirname "$0")/.."
py=(python3 -m pip)
mkdir -p .whl .debs .bpf .xfs
if ! ls .whl/deepspeed-0.19.8-*.whl >/dev/null 2>&1; then
    "${py[@]}" wheel -q --no-deps --no-build-isolation -w .whl deepspeed==0.19.8
fi
for w in pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2 \
         typing-extensions==4.15.0 hjson==3.1.0 pyudev==0.24.3 ninja==1.13.0 psutil==7.2.2 \
         accelerate==1.15.0 lightning==2.6.6 lightning-utilities==0.15.3 torchmetrics==1.9.0; do
    name="${w%%==*}"; glob="$(echo "$name" | tr - _)"
    ls .whl/"$glob"-* >/dev/null 2>&1 && continue
    "${py[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
        --platform manylinux1_x86_64 --platform any -d .whl "$w"
done
(cd .debs && apt-get download libaio1 libaio-dev >/dev/null)
(cd .bpf && apt-get download libbpf1 libelf1 >/dev/null)
(cd .xfs && apt-get download xfsprogs libinih1 liburcu8 >/dev/null)
if [ "${IOTUNE_CARRY_BCC:-0}" = 1 ]; then
    mkdir -p .bcc
    (cd .bcc && apt-get download libbpfcc python3-bpfcc libbpf1 libllvm14 libclang-cpp14 libz3-4 \
        libedit2 linux-headers-6.1.0-56-amd64 linux-headers-6.1.0-56-common >/dev/null)
fi
du -sh .whl .debs .bpf .xfs .bcc 2>/dev/null
