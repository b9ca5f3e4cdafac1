# Source on a GPU machine that has torch and transformers but no DeepSpeed or libaio, from the
# repository root, with the wheels in .whl/ (DeepSpeed 0.19.8 built with `pip wheel --no-deps`,
# pydantic, pydantic-core cp312, annotated-types, typing-inspection, typing_extensions, hjson, psutil,
# pyudev) and Debian's libaio1 + libaio-dev .debs in .debs/:
#     . benchmarks/gpu_env.sh
if [ ! -d /tmp/site/deepspeed ]; then
    pip install --quiet --no-index --no-deps --target /tmp/site .whl/*.whl
fi
mkdir -p /tmp/aio
for d in .debs/*.deb; do dpkg -x "$d" /tmp/aio; done
export PYTHONPATH="/tmp/site:$PWD"
export CPATH=/tmp/aio/usr/include
export LIBRARY_PATH=/tmp/aio/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="/tmp/aio/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export CFLAGS="-I/tmp/aio/usr/include" LDFLAGS="-L/tmp/aio/usr/lib/x86_64-linux-gnu"
# the image's "9.0a" is not parsed by DeepSpeed's op builder
export TORCH_CUDA_ARCH_LIST=9.0
