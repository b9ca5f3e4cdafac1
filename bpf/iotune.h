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
/* completions only: a write with REQ_PREFLUSH and no data (issued as "FWS", completed as a
 * "W" of 0 sectors). blk-mq issues only its flush request, but completes and accounts the
 * empty write as a write io */
#define OP_EMPTY_PREFLUSH 5
/* completions only: the second completion of a write with data that the flush machinery
 * sequenced (PREFLUSH and/or FUA emulated by flushes). Its data completed first, unaccounted
 * (RQF_FLUSH_SEQ); when the sequence is done, blk_flush_complete_seq() ends the request again
 * with no bytes left, and that end is the one the kernel accounts as a write io. Told from an
 * empty pre-flush by its sector: blk_rq_pos() has advanced past the data, while an empty
 * flush bio carries sector 0. */
#define OP_FLUSH_SEQ_DONE 6

/* one counter per (device, operation, exact request size in bytes) */
struct size_key {
    u32 dev;    /* kernel dev_t encoding: major << 20 | minor */
    u32 op;
    u32 bytes;
    u32 pad;
};

/* completions per (device, operation): what /sys/block/<dev>/stat accounts */
struct done_key {
    u32 dev;
    u32 op;
};

struct done_val {
    u64 ios;
    u64 sectors;
};

/* bios per (device, operation, submitting process); tgid 0 stands for the workload */
struct owner_key {
    u32 dev;
    u32 op;
    u32 tgid;
    u32 pad;
};

struct owner_val {
    u64 bios;
    u64 sectors;
};

struct comm_val {
    char comm[16];
};

#endif
