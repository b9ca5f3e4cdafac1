# Sourced by the GPU tier's checkpoint-writer scripts (gpu_ckpt_sweep.sh, gpu_ckpt_pairs.sh):
# `ckpt_prelude DIR` writes the machine's description into DIR/machine.txt and builds the
# ops DeepSpeed's fast writer loads (aio, utils), their output in DIR/build.txt.
ckpt_prelude() {
    {
        nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
        nproc; free -g | head -2; lsblk -d -o NAME,SIZE,ROTA,MODEL; uname -r; df -h /var/tmp
        cat /sys/block/vda/queue/scheduler /sys/block/vda/queue/max_sectors_kb
    } > "$1/machine.txt" 2>&1
    python3 -c 'from deepspeed.ops.op_builder import AsyncIOBuilder; AsyncIOBuilder().load()
from deepspeed.ops.op_builder.utils import UtilsBuilder; UtilsBuilder().load()' > "$1/build.txt" 2>&1
}
