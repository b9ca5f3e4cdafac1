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

/* a filter: only the requests whose first bio the workload (its process tree) or one
 * cgroup v2 (its processes and those of every cgroup below it) submitted (the bio's
 * submitter, at block_bio_queue) */
#define ONLY_ALL 0
#define ONLY_WORKLOAD 1
#define ONLY_CGROUP 2
/* the bios a filter keeps track of at once (least recently used first out) */
#define MINE_BIOS 65536

/* Latency and queue depth (the first SLOT_DEVS traced devices: the rows of the arrays).
 * A request is timed from its issue to its completion (and, where block_rq_insert fires,
 * from its insertion to its issue), into log-linear histograms: below LAT_SUB ns a slot per
 * nanosecond, then LAT_SUB slots per power of two (each slot 1/16 of its octave wide, so a
 * value read back as its slot's middle is within 1/32 of the truth), up to 2^LAT_MAX_LOG
 * ns; anything longer in the last slot. iotune/trace/latency.py mirrors lat_slot(). */
#define LAT_SUB_BITS 4
#define LAT_SUB (1 << LAT_SUB_BITS)
#define LAT_MAX_LOG 39
#define LAT_SLOTS ((LAT_MAX_LOG - LAT_SUB_BITS + 2) * LAT_SUB)
/* requests in flight at a drive as each is issued: a slot per depth, the last one for
 * deeper */
#define DEPTH_SLOTS 1024
/* per device row in `inflight`: [0] requests in flight now, [1] unused, [2] requests issued again
 * before their completion was seen (their first issue's time dropped), [3] the summed time
 * in flight (ns) of completed requests other than reads and writes, [4] of reads, [5] of
 * writes, [6] issues whose stamp slot held another request in flight (timed in `starts`),
 * [7] unused */
#define INFLIGHT_WORDS 8
#define IN_REISSUED 2
#define IN_BUSY 3
#define IN_COLLIDED 6
/* the stamps of requests in flight where the programs get the request (BTF): a slot per
 * hash of what names a request while the driver has it (its device row, hardware queue and
 * driver tag), claimed with a compare-and-swap; a slot another request holds sends the issue
 * to the `starts` hash map (a hash map's update and delete cost several times a slot's) */
#define STAMP_BITS 16
#define STAMP_SLOTS (1 << STAMP_BITS)

struct stamp {
    u64 rq;    /* the request's name (stamp_name()); 0: free */
    u64 ns;
    u32 bytes;
    u32 op;
};

/* a request's insertion time, in `qstamps` by the slot of its name then (its scheduler tag
 * where it has one: it gets its driver tag later), told from an earlier request of the same
 * name left there (merged into another, never issued) by its sector */
struct qstamp {
    u64 name;  /* 0: free */
    u64 sector;
    u64 ns;
};

/* a request's name while the driver has it: its device row (≥ 1, so never 0), hardware
 * queue and driver tag, unique among the requests in flight */
static __always_inline u64 stamp_name(u32 row, u32 hwq, u32 tag)
{
    return ((u64)row << 48) | ((u64)(hwq & 0xfffffff) << 20) | (tag & 0xfffff);
}

/* the stamp slot of a request's name (Fibonacci hashing: the top bits of its product) */
static __always_inline u32 stamp_slot(u64 name)
{
    return (u32)((name * 0x9E3779B97F4A7C15ULL) >> (64 - STAMP_BITS));
}
/* the in-flight requests that can be timed at once, over every traced device */
#define START_MAX 65536

/* what identifies a request from its issue to its completion: the struct request's
 * address where the programs get it (BTF), else (dev, sector) as bcc's biolatency keys */
struct start_key {
    u64 id;
    u64 sector;
};

struct start_val {
    u64 ns;    /* bpf_ktime_get_ns() at issue */
    u32 bytes; /* the request's size at issue */
    u32 op;    /* its class (OP_*) */
};

/* floor(log2(v)) of v > 0, without a loop */
static __always_inline u32 ilog2_u64(u64 v)
{
    u32 r, s;
    r = (v >= (1ULL << 32)) << 5;
    v >>= r;
    s = (v >= (1ULL << 16)) << 4;
    v >>= s;
    r |= s;
    s = (v >= (1ULL << 8)) << 3;
    v >>= s;
    r |= s;
    s = (v >= (1ULL << 4)) << 2;
    v >>= s;
    r |= s;
    s = (v >= (1ULL << 2)) << 1;
    v >>= s;
    r |= s;
    return r | (u32)(v >> 1);
}

/* the histogram slot of *ns* */
static __always_inline u32 lat_slot(u64 ns)
{
    if (ns < LAT_SUB)
        return (u32)ns;
    u32 k = ilog2_u64(ns);
    if (k > LAT_MAX_LOG)
        return LAT_SLOTS - 1;
    return (k - LAT_SUB_BITS + 1) * LAT_SUB + (u32)((ns >> (k - LAT_SUB_BITS)) & (LAT_SUB - 1));
}

#endif
