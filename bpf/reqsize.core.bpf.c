// SPDX-License-Identifier: GPL-2.0
// Exact per-request size accounting for iotune trace, as one BPF CO-RE object for libbpf
// (iotune/trace/libbpf.py loads it; bpf/build.sh compiles it). It counts what
// reqsize.bpf.c counts, with the same maps and keys (iotune.h), so the two backends give
// the same tables; the comments there say why each event is read.
//
// No kernel headers and no compiler at run time: the kernel types below name only the fields
// read, marked preserve_access_index, so libbpf relocates every access to the running
// kernel's layout from its BTF (/sys/kernel/btf/vmlinux) when it loads the object. The
// programs are BTF tracepoints (tp_btf): run directly at the tracepoint, never skipped on a
// CPU busy with another BPF program (a program that would run inside itself on a CPU is
// skipped and counted in its recursion_misses, which iotune reads).
//
// What the bcc build takes as -D flags is set by user space before the load: the sizes of
// the arrays (max_entries) and the configuration in .rodata (`cfg`), which the verifier
// reads as constants, so the branches a configuration does not take are not even loaded.

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef u64 sector_t;
typedef _Bool bool;
#define true 1
#define false 0

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "iotune.h"

/* the kernel's types: only the fields read, at the running kernel's offsets (CO-RE) */
struct gendisk {
    int major;
    int first_minor;
} __attribute__((preserve_access_index));

struct request_queue {
    struct gendisk *disk;
} __attribute__((preserve_access_index));

struct blk_mq_hw_ctx {
    unsigned int queue_num;
} __attribute__((preserve_access_index));

struct request {
    struct request_queue *q;
    struct bio *bio;
    struct blk_mq_hw_ctx *mq_hctx;
    int tag;
    int internal_tag;
    unsigned int cmd_flags;
    unsigned int __data_len;
    sector_t __sector;
} __attribute__((preserve_access_index));

struct block_device {
    struct gendisk *bd_disk;
} __attribute__((preserve_access_index));

struct bvec_iter {
    unsigned int bi_size;
} __attribute__((preserve_access_index));

struct bio {
    struct block_device *bi_bdev;
    unsigned int bi_opf;
    struct bvec_iter bi_iter;
} __attribute__((preserve_access_index));

struct task_struct {
    int tgid;
} __attribute__((preserve_access_index));

/* enum req_op (6.0 and later; before, req_opf): its values relocated by name where the
 * kernel has it, else these, which have not changed since 4.10 */
enum req_op {
    REQ_OP_READ = 0,
    REQ_OP_WRITE = 1,
    REQ_OP_FLUSH = 2,
    REQ_OP_DISCARD = 3,
    REQ_OP_SECURE_ERASE = 5,
};

#define OPV(name)                                                                           \
    (bpf_core_enum_value_exists(enum req_op, name) ? bpf_core_enum_value(enum req_op, name) \
                                                   : name)

/* a row per device in the arrays for the first SLOT_DEVS traced devices, as in the bcc
 * build; its sizes and op counts are the same (iotune/trace/bpf.py) */
#define SLOT_DEVS 16
#define SLOT_SECTORS 2048
#define DONE_OPS 8
#define OWNER_OPS 5
#define MAX_SIZES 65536
#define NO_ROW 0xffff

/* the configuration, written into .rodata by user space before the load */
struct config {
    u32 slot_devs;  /* devices with a row: the first ones of devs[] */
    u32 filter;     /* 1: only devices in `devices` (and devs[]) are counted */
    u32 devs[SLOT_DEVS];
    u32 focus;      /* the request size whose latency is kept apart (FOCUS_BYTES) */
    u32 latency;    /* 1: time the requests and count the depth (LATENCY) */
    u32 only;       /* ONLY_*: count only the requests whose first bio was submitted so */
};

const volatile struct config cfg = {};

#define MAP(kind, name, k, v, n, ...)                                                        \
    struct {                                                                                \
        __uint(type, kind);                                                                 \
        __uint(max_entries, n);                                                             \
        __type(key, k);                                                                     \
        __type(value, v);                                                                   \
        __VA_ARGS__                                                                         \
    } name SEC(".maps")

MAP(BPF_MAP_TYPE_HASH, sizes, struct size_key, u64, MAX_SIZES);
MAP(BPF_MAP_TYPE_HASH, devices, u32, u32, 1024);
/* sized by user space: rows x 2 x (SLOT_SECTORS + 1), rows x DONE_OPS, rows x OWNER_OPS */
MAP(BPF_MAP_TYPE_ARRAY, slots, u32, u64, 1, __uint(map_flags, BPF_F_MMAPABLE););
MAP(BPF_MAP_TYPE_ARRAY, dones, u32, struct done_val, 1, __uint(map_flags, BPF_F_MMAPABLE););
MAP(BPF_MAP_TYPE_HASH, done, struct done_key, struct done_val, 4096);
MAP(BPF_MAP_TYPE_ARRAY, dropped, u32, u64, 4); /* full: [0] sizes, [1] starts, [2] done, [3] owners */
MAP(BPF_MAP_TYPE_HASH, workload, u32, u8, 65536);
MAP(BPF_MAP_TYPE_HASH, owners, struct owner_key, struct owner_val, 4096);
MAP(BPF_MAP_TYPE_HASH, comms, u32, struct comm_val, 1024);
MAP(BPF_MAP_TYPE_ARRAY, wowners, u32, struct owner_val, 1, __uint(map_flags, BPF_F_MMAPABLE););
/* latency and depth (iotune.h), sized by user space: rows x 4 x LAT_SLOTS, rows x 2 x
 * LAT_SLOTS, rows x DEPTH_SLOTS, rows x INFLIGHT_WORDS */
MAP(BPF_MAP_TYPE_ARRAY, lat, u32, u64, 1, __uint(map_flags, BPF_F_MMAPABLE););
MAP(BPF_MAP_TYPE_ARRAY, qlat, u32, u64, 1, __uint(map_flags, BPF_F_MMAPABLE););
MAP(BPF_MAP_TYPE_ARRAY, depth, u32, u64, 1, __uint(map_flags, BPF_F_MMAPABLE););
MAP(BPF_MAP_TYPE_ARRAY, inflight, u32, u64, 1, __uint(map_flags, BPF_F_MMAPABLE););
MAP(BPF_MAP_TYPE_HASH, starts, struct start_key, struct start_val, START_MAX);
MAP(BPF_MAP_TYPE_ARRAY, stamps, u32, struct stamp, STAMP_SLOTS);
MAP(BPF_MAP_TYPE_ARRAY, qstamps, u32, struct qstamp, STAMP_SLOTS);
/* with a filter (cfg.only): the bios submitted by the workload or its cgroup, by address,
 * from block_bio_queue until the completion of the request they start */
MAP(BPF_MAP_TYPE_LRU_HASH, mine_bios, u64, u8, MINE_BIOS);
/* with ONLY_CGROUP: the cgroup v2 named, in slot 0 (user space puts a file descriptor of its
 * directory there before the programs attach). Its processes are mostly in the cgroups below
 * it: under cgroup v2 a cgroup with controllers enabled (a pod, a slice) holds none itself.
 * An fd array: sizes, not BTF types, as the kernel takes no BTF for one */
struct {
    __uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
    __uint(max_entries, 1);
    __uint(key_size, sizeof(u32));
    __uint(value_size, sizeof(u32));
} only_cgroup SEC(".maps");

struct mine_cache {
    u32 tgid;
    u32 mine;
    u64 generation;
};
MAP(BPF_MAP_TYPE_PERCPU_ARRAY, mine_last, u32, struct mine_cache, 1);
MAP(BPF_MAP_TYPE_ARRAY, generation, u32, u64, 1);

char LICENSE[] SEC("license") = "GPL";

static __always_inline u32 traced(u32 dev)
{
    if (!cfg.filter)
        return NO_ROW;
#pragma unroll
    for (int i = 0; i < SLOT_DEVS; i++)
        if (i < cfg.slot_devs && cfg.devs[i] == dev)
            return i + 1;
    u32 *row = bpf_map_lookup_elem(&devices, &dev);
    return row ? *row : 0;
}

/* the class blk_fill_rwbs() gives an op: write zeroes, like every op it names "N", are
 * "other" */
static __always_inline u32 req_class(u32 opf)
{
    u32 op = opf & 0xff; /* REQ_OP_MASK */
    if (op == OPV(REQ_OP_READ))
        return OP_READ;
    if (op == OPV(REQ_OP_WRITE))
        return OP_WRITE;
    if (op == OPV(REQ_OP_DISCARD) || op == OPV(REQ_OP_SECURE_ERASE))
        return OP_DISCARD;
    if (op == OPV(REQ_OP_FLUSH))
        return OP_FLUSH;
    return OP_OTHER;
}

static __always_inline void count_drop(u32 which)
{
    u64 *d = bpf_map_lookup_elem(&dropped, &which);
    if (d)
        __sync_fetch_and_add(d, 1);
}

/* the entry of *key* in the hash *map*, created at zero where missing (-EEXIST on a race is
 * fine: the lookup after finds it); NULL where the map is full, counted in dropped[which] */
static __always_inline void *lookup_or_zero(void *map, const void *key, const void *zero,
                                            u32 which)
{
    void *val = bpf_map_lookup_elem(map, key);
    if (val)
        return val;
    bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
    val = bpf_map_lookup_elem(map, key);
    if (!val)
        count_drop(which);
    return val;
}

/* one more event of *n* sectors in a (count, sectors) pair: struct done_val, owner_val */
static __always_inline void count_pair(u64 *pair, u32 n)
{
    __sync_fetch_and_add(&pair[0], 1);
    __sync_fetch_and_add(&pair[1], n);
}

static __always_inline void bump(u32 row, u32 dev, u32 op, u32 bytes, u64 delta, bool create)
{
    u64 zero = 0, *val;
    if (row <= cfg.slot_devs && op <= OP_WRITE && !(bytes & 511) &&
        (bytes >> 9) <= SLOT_SECTORS) {
        u32 i = ((row - 1) * 2 + op) * (SLOT_SECTORS + 1) + (bytes >> 9);
        val = bpf_map_lookup_elem(&slots, &i);
        if (val)
            __sync_fetch_and_add(val, delta);
        return;
    }
    struct size_key sk = {.dev = dev, .op = op, .bytes = bytes};
    val = create ? lookup_or_zero(&sizes, &sk, &zero, 0) : bpf_map_lookup_elem(&sizes, &sk);
    if (val)
        __sync_fetch_and_add(val, delta);
}

/* add *delta* to the u64 at index *i* of the array *map* */
static __always_inline void add_at(void *map, u32 i, u64 delta)
{
    u64 *v = bpf_map_lookup_elem(map, &i);
    if (v)
        __sync_fetch_and_add(v, delta);
}

/* with a filter: whether request *rq* is the workload's (its first bio was); *done*: its
 * completion, which forgets the bio */
static __always_inline bool passes(struct request *rq, bool done)
{
    if (!cfg.only)
        return true;
    struct bio *bio = rq->bio;
    if (!bio)
        return false;
    u64 key = (u64)bio;
    if (!bpf_map_lookup_elem(&mine_bios, &key))
        return false;
    if (done)
        bpf_map_delete_elem(&mine_bios, &key);
    return true;
}

/* a request's name for its stamp (iotune.h stamp_name) */
static __always_inline u64 rq_name(u32 row, struct request *rq)
{
    return stamp_name(row, rq->mq_hctx->queue_num, (u32)rq->tag);
}

/* a request's name from its insertion to its issue: by its scheduler tag where it has one */
static __always_inline u64 rq_qname(u32 row, struct request *rq)
{
    int itag = rq->internal_tag;
    return stamp_name(row, rq->mq_hctx->queue_num,
                      itag >= 0 ? (u32)itag | (1U << 19) : (u32)rq->tag);
}

/* the drive's depth as an issue of *row* finds it: one more in flight */
static __always_inline void count_depth(u32 row, u32 base)
{
    u64 *n = bpf_map_lookup_elem(&inflight, &base);
    if (!n)
        return;
    u64 d = __sync_fetch_and_add(n, 1) + 1;
    add_at(&depth, (row - 1) * DEPTH_SLOTS + (d < DEPTH_SLOTS ? (u32)d : DEPTH_SLOTS - 1), 1);
}

/* an issue of request *rq* of *row* (≤ slot_devs): its start time kept in its stamp slot
 * (or in `starts` where another request holds the slot), the drive's depth counted
 * (bpf/reqsize.bpf.c says the same) */
static __always_inline void timed_issue(u32 row, struct request *rq, u32 op, u32 bytes, u64 now)
{
    u64 name = rq_name(row, rq);
    u32 base = (row - 1) * INFLIGHT_WORDS, i = stamp_slot(name);
    struct stamp *s = bpf_map_lookup_elem(&stamps, &i);
    if (!s)
        return;
    u64 held = __sync_val_compare_and_swap(&s->rq, 0, name);
    if (held == 0 || held == name) {
        s->ns = now;
        s->bytes = bytes;
        s->op = op;
        if (held == name) { /* issued again before a completion was seen */
            add_at(&inflight, base + IN_REISSUED, 1);
            return;
        }
        count_depth(row, base);
        return;
    }
    add_at(&inflight, base + IN_COLLIDED, 1);
    struct start_key k = {.id = (u64)rq};
    struct start_val v = {.ns = now, .bytes = bytes, .op = op};
    long err = bpf_map_update_elem(&starts, &k, &v, BPF_NOEXIST);
    if (err == -17) { /* -EEXIST */
        bpf_map_update_elem(&starts, &k, &v, BPF_ANY);
        add_at(&inflight, base + IN_REISSUED, 1);
        return;
    }
    if (err) {
        count_drop(1);
        return;
    }
    count_depth(row, base);
}

/* a completion (*done*) or a requeue of request *rq* of *row*: its time in flight ends */
static __always_inline void timed_end(u32 row, struct request *rq, bool done, u64 now)
{
    u64 name = rq_name(row, rq), ns;
    u32 i = stamp_slot(name), op, bytes;
    struct stamp *s = bpf_map_lookup_elem(&stamps, &i);
    if (!s)
        return;
    if (s->rq == name) {
        ns = now - s->ns;
        op = s->op;
        bytes = s->bytes;
        asm volatile("" ::: "memory"); /* read before the slot is freed */
        s->rq = 0;
    } else {
        struct start_key k = {.id = (u64)rq};
        struct start_val *v = bpf_map_lookup_elem(&starts, &k);
        if (!v)
            return;
        ns = now - v->ns;
        op = v->op;
        bytes = v->bytes;
        bpf_map_delete_elem(&starts, &k);
    }
    u32 base = (row - 1) * INFLIGHT_WORDS;
    add_at(&inflight, base, (u64)-1);
    if (!done)
        return;
    add_at(&inflight, base + IN_BUSY + (op <= OP_WRITE ? op + 1 : 0), ns);
    if (op <= OP_WRITE)
        add_at(&lat, (((row - 1) * 2 + op) * 2 + (bytes != cfg.focus)) * LAT_SLOTS + lat_slot(ns),
               1);
}

/* disk_devt(): major << 20 | first_minor, 0 without a disk (as the tracepoints report) */
static __always_inline u32 disk_dev(struct gendisk *disk)
{
    if (!disk)
        return 0;
    return ((u32)disk->major << 20) | (u32)disk->first_minor;
}

static __always_inline u32 rq_dev(struct request *rq)
{
    return disk_dev(rq->q->disk);
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(block_rq_issue, struct request *rq)
{
    /* the block tracepoints pass the request first since 5.11 and bio->bi_bdev exists since
     * 5.12: on a kernel without that field this relocation fails and the object does not
     * load, rather than reading another struct as a request */
    if (bpf_core_field_offset(struct bio, bi_bdev) == 0xffffffff)
        return 0;
    u32 dev = rq_dev(rq), row = traced(dev);
    if (!row || !passes(rq, false))
        return 0;
    u32 op = req_class(rq->cmd_flags), bytes = rq->__data_len;
    bump(row, dev, op, bytes, 1, true);
    if (cfg.latency && row <= cfg.slot_devs) {
        u64 now = bpf_ktime_get_ns(), qname = rq_qname(row, rq);
        u32 qi = stamp_slot(qname);
        struct qstamp *q = bpf_map_lookup_elem(&qstamps, &qi);
        if (q && q->name == qname && q->sector == rq->__sector) {
            /* inserted while traced: its wait before the driver */
            if (op <= OP_WRITE)
                add_at(&qlat, ((row - 1) * 2 + op) * LAT_SLOTS + lat_slot(now - q->ns), 1);
            q->name = 0;
        }
        timed_issue(row, rq, op, bytes, now);
    }
    return 0;
}

/* blk_rq_bytes() of the requeued request: what its issue reported */
SEC("tp_btf/block_rq_requeue")
int BPF_PROG(block_rq_requeue, struct request *rq)
{
    u32 dev = rq_dev(rq), row = traced(dev);
    if (!row || !passes(rq, false))
        return 0;
    bump(row, dev, req_class(rq->cmd_flags), rq->__data_len, (u64)-1, false);
    if (cfg.latency && row <= cfg.slot_devs)
        timed_end(row, rq, false, bpf_ktime_get_ns());
    return 0;
}

/* a request put in a scheduler's queue or a plug's list before the driver takes it */
SEC("tp_btf/block_rq_insert")
int BPF_PROG(block_rq_insert, struct request *rq)
{
    u32 row = traced(rq_dev(rq));
    if (row && cfg.latency && row <= cfg.slot_devs) {
        /* plain stores: a slot two insertions race for keeps one of them, and the other's
         * wait is not timed */
        u64 qname = rq_qname(row, rq);
        u32 qi = stamp_slot(qname);
        struct qstamp *q = bpf_map_lookup_elem(&qstamps, &qi);
        if (q) {
            q->ns = bpf_ktime_get_ns();
            q->sector = rq->__sector;
            q->name = qname;
        }
    }
    return 0;
}

static __always_inline void count_done(u32 row, u32 dev, u32 op, u32 nr_sector, u64 sector)
{
    struct done_key k = {.dev = dev, .op = op};
    /* an empty write is an empty pre-flush, or the final end of a sequenced data write,
     * which sits past its data (iotune.h) */
    if (k.op == OP_WRITE && nr_sector == 0)
        k.op = sector ? OP_FLUSH_SEQ_DONE : OP_EMPTY_PREFLUSH;
    struct done_val zero = {}, *val;
    if (row <= cfg.slot_devs && k.op < DONE_OPS) {
        u32 i = (row - 1) * DONE_OPS + k.op;
        val = bpf_map_lookup_elem(&dones, &i);
    } else {
        val = lookup_or_zero(&done, &k, &zero, 2);
    }
    if (val)
        count_pair(&val->ios, nr_sector);
}

/* (rq, error, nr_bytes): the classic tracepoint's nr_sector is nr_bytes >> 9 */
SEC("tp_btf/block_rq_complete")
int BPF_PROG(block_rq_complete, struct request *rq, int error, unsigned int nr_bytes)
{
    u32 dev = rq_dev(rq), row = traced(dev);
    if (!row || !passes(rq, true))
        return 0;
    count_done(row, dev, req_class(rq->cmd_flags), nr_bytes >> 9, rq->__sector);
    if (cfg.latency && row <= cfg.slot_devs)
        timed_end(row, rq, true, bpf_ktime_get_ns());
    return 0;
}

/* Whether a tgid is the workload's, without a hash lookup per bio: each CPU remembers its
 * last answer while the workload set has not grown (`generation`; user space starts it at
 * 1, so a CPU's zeroed memory is never valid) */
static __always_inline bool is_workload(u32 tgid)
{
    u32 zero = 0;
    u64 *gen = bpf_map_lookup_elem(&generation, &zero);
    struct mine_cache *c = bpf_map_lookup_elem(&mine_last, &zero);
    if (!gen || !c)
        return bpf_map_lookup_elem(&workload, &tgid) != NULL;
    u64 g = *(volatile u64 *)gen;
    if (g && c->generation == g && c->tgid == tgid)
        return c->mine;
    bool mine = bpf_map_lookup_elem(&workload, &tgid) != NULL;
    c->tgid = tgid;
    c->mine = mine;
    c->generation = g;
    return mine;
}

/* a bio of the whole disk *dev* (the partition is remapped before block_bio_queue fires),
 * class *op*, *nr_sector* long, submitted by the current task */
SEC("tp_btf/block_bio_queue")
int BPF_PROG(block_bio_queue, struct bio *bio)
{
    struct block_device *bdev = bio->bi_bdev;
    if (!bdev)
        return 0;
    u32 dev = disk_dev(bdev->bd_disk), row = traced(dev);
    if (!row)
        return 0;
    u32 op = req_class(bio->bi_opf), nr_sector = bio->bi_iter.bi_size >> 9;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct owner_key k = {.dev = dev, .op = op};
    /* the submitter's cgroup is the one named or below it (1; 0 not, < 0 an empty slot):
     * its own cgroup's id alone would match only a cgroup that holds processes itself, and an
     * ancestor's id at the named cgroup's level needs that level, which a path under a cgroup
     * namespace's mount does not tell (reqsize.bpf.c says the same) */
    bool mine = cfg.only == ONLY_CGROUP ? bpf_current_task_under_cgroup(&only_cgroup, 0) == 1
                                        : is_workload(tgid);
    if (cfg.only) { /* a bio's address is reused: forget what it was before */
        u64 key = (u64)bio;
        u8 one = 1;
        if (mine)
            bpf_map_update_elem(&mine_bios, &key, &one, BPF_ANY);
        else
            bpf_map_delete_elem(&mine_bios, &key);
    }
    struct owner_val zero = {}, *val;
    if (mine && row <= cfg.slot_devs) {
        /* the workload's bios: a plain array by device and op, as for the sizes */
        u32 i = (row - 1) * OWNER_OPS + k.op;
        val = bpf_map_lookup_elem(&wowners, &i);
    } else {
        if (!mine) {
            k.tgid = tgid;
            struct comm_val c = {};
            bpf_get_current_comm(c.comm, sizeof(c.comm));
            bpf_map_update_elem(&comms, &tgid, &c, BPF_ANY);
        }
        val = lookup_or_zero(&owners, &k, &zero, 3);
    }
    if (val)
        count_pair(&val->bios, nr_sector);
    return 0;
}

/* every process the workload creates joins it. *parent* is the creating thread, which may be
 * any thread of a workload process (one older than the trace included): the workload is a set
 * of processes (tgids), looked up by the creator's. A new thread is its creator's process
 * already: nothing to add */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(sched_process_fork, struct task_struct *parent, struct task_struct *child)
{
    u32 ptgid = parent->tgid, ctgid = child->tgid;
    u8 one = 1;
    if (ctgid != ptgid && bpf_map_lookup_elem(&workload, &ptgid)) {
        bpf_map_update_elem(&workload, &ctgid, &one, BPF_ANY);
        u32 zero = 0;
        u64 *gen = bpf_map_lookup_elem(&generation, &zero);
        if (gen)
            __sync_fetch_and_add(gen, 1);
    }
    return 0;
}
