/* Map key/value layouts shared by iotune's BPF programs and mirrored in
 * iotune/trace/bpf.py (ctypes). Keep both in sync. */
#ifndef IOTUNE_H
#define IOTUNE_H

/* operation class, from the op letter of rwbs (a leading 'F' is a pre-flush flag) */
#define OP_READ    0
#define OP_WRITE   1
#define OP_DISCARD 2
#define OP_FLUSH   3
#define OP_OTHER   4

/* one counter per (device, operation, exact request size in bytes) */
struct size_key {
    u32 dev;    /* kernel dev_t encoding: major << 20 | minor */
    u32 op;
    u32 bytes;
    u32 pad;
};

/* one counter per (device, operation, log2 slot of the size), for display only */
struct hist_key {
    u32 dev;
    u32 op;
    u32 slot;
    u32 pad;
};

#endif
