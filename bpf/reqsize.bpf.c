// Exact per-request size accounting for iotune trace.
//
// block:block_rq_issue fires once per request handed to the driver, after merging and
// splitting, on the whole disk (never a partition; never md, which is bio-based). Each
// request increments a counter keyed by (dev, op, exact bytes): no power-of-two buckets,
// so 512 KiB and 1023 KiB stay apart. Counters are shared hash entries incremented
// atomically; an entry that cannot be created because the map is full is counted in
// `dropped`, never lost silently.
//
// A request the driver cannot take (a full virtio or SCSI queue: BLK_STS_RESOURCE) is
// requeued and issued again later, firing block_rq_issue twice; the kernel's diskstats count
// it once, at completion. block:block_rq_requeue takes such an issue back out.
//
// The kernel accounts /sys/block/<dev>/stat at completion, not at issue: a request in flight
// when tracing starts is counted there but never seen issued here. block:block_rq_complete
// counts completions per (dev, op) the way blk_account_io_completion()/_done() do, so the
// cross-check compares like with like; the difference between issues and completions is the
// requests in flight at either end, which /sys/block/<dev>/inflight tells.
//
// With OWNERS, block:block_bio_queue attributes each bio to its submitting process (the
// task that calls submit_bio: the workload for O_DIRECT swap I/O, a kworker or jbd2 for
// writeback and journal): bios of the workload's process tree (the `workload` set, grown
// at every fork) are summed under tgid 0, any other submitter under its own tgid, so I/O
// that is not the workload's can be named beside the table instead of folded into it.
//
// A tracepoint program is not run when an event fires while another BPF tracing program runs
// on the same CPU (the kernel's per-CPU bpf_prog_active): an I/O completion interrupt that
// arrives while the issue program runs is not counted here, although the kernel counts it.
// Kernels from 6.7 count such skips in the program's recursion_misses; older ones do not. So
// every program here marks its CPU busy while it runs, and raw tracepoints on issue and
// completion (which do not take bpf_prog_active) count the events that fire on a busy CPU:
// `nested` is an upper bound of the events this tracer's own programs made the kernel skip.
//
// Two ways to read the events, one compiled in (BTF_TP):
// - BTF_TP=1, where the kernel has BTF: btf__EVENT programs attached as BTF tracepoints
//   (libbpf's tp_btf; iotune/trace/btf.py loads them). They get the tracepoint's arguments
//   (struct request *, struct bio *) and read the few fields they need at offsets taken from
//   the running kernel's BTF. The kernel runs them directly at the tracepoint; they are not
//   subject to bpf_prog_active, so they are never skipped on a CPU busy with another
//   program, and NESTED is 0.
// - BTF_TP=0: classic tracepoint programs (TRACEPOINT_PROBE). Before each runs, the kernel
//   fills the event's whole record (device, sector, rwbs, comm, cmd), which costs more than
//   the program itself.
//
// Compile-time constants (bcc cflags): MAX_SIZES, SLOT_DEVS (rows of the arrays: the first
// traced devices, listed in DEVS), SLOT_SECTORS (the largest size they count, in sectors),
// DONE_OPS, NESTED (1: count events skipped on a busy CPU, for kernels before 6.7), FILTER (1: only devices in
// `devices` are counted), OWNERS (1: attribute bios to submitters), LATENCY (1: time the
// requests and count the depth), FOCUS_BYTES (the request size whose latency is kept apart
// from every other's), ONLY (iotune.h ONLY_*: count only the workload's or one cgroup's
// requests, BTF programs only; with OWNERS). With ONLY_CGROUP, user space puts the cgroup v2
// in slot 0 of `only_cgroup` (by a file descriptor of its directory) before the programs attach.
//
// Latency and depth (iotune.h): every request of a device with a row is timed from its issue
// to its completion in `starts`, keyed by the request (BTF) or by (dev, sector) (classic
// tracepoints, which have no request pointer); the BTF programs also time insertion to issue
// (block_rq_insert: requests that wait in a scheduler or a plug). The CO-RE build keeps the
// stamps in arrays instead (iotune.h struct stamp), at a fraction of the hash maps' cost. `inflight` counts the
// timed requests at the drive; the depth each issue finds (itself included) is a histogram.
#include "iotune.h"

BPF_HASH(sizes, struct size_key, u64, MAX_SIZES);
/* value: 1 + the device's row in the arrays below, or NO_ROW for a device without one */
BPF_HASH(devices, u32, u32, 1024);
#define NO_ROW 0xffff
#if SLOT_DEVS
/* The common case without a hash lookup: reads and writes whose size is a whole number of
 * sectors up to SLOT_SECTORS count in a plain array, row by device, column by op and size
 * in sectors; completions count per device and op in another. User space reads both through
 * a read-only mmap (BPF_F_MMAPABLE), no system call per counter. Any other request goes to
 * the hash maps. */
BPF_F_TABLE("array", u32, u64, slots, SLOT_DEVS * 2 * (SLOT_SECTORS + 1), (1U << 10));
BPF_F_TABLE("array", u32, struct done_val, dones, SLOT_DEVS * DONE_OPS, (1U << 10));
#endif
/* latency and depth, where timed (LATENCY): row x op (read, write) x class (FOCUS_BYTES,
 * other) x slot; queued: row x op x slot; depth: row x depth at issue; inflight: row x
 * INFLIGHT_WORDS (iotune.h) */
#define TIMED (SLOT_DEVS && LATENCY)
#if TIMED
BPF_F_TABLE("array", u32, u64, lat, SLOT_DEVS * 4 * LAT_SLOTS, (1U << 10));
BPF_F_TABLE("array", u32, u64, qlat, SLOT_DEVS * 2 * LAT_SLOTS, (1U << 10));
BPF_F_TABLE("array", u32, u64, depth, SLOT_DEVS * DEPTH_SLOTS, (1U << 10));
BPF_F_TABLE("array", u32, u64, inflight, SLOT_DEVS * INFLIGHT_WORDS, (1U << 10));
BPF_HASH(starts, struct start_key, struct start_val, START_MAX);
#if BTF_TP
BPF_HASH(queued, struct start_key, u64, START_MAX);
#endif
#endif
BPF_HASH(done, struct done_key, struct done_val, 4096);
BPF_ARRAY(dropped, u64, 4);  /* map full: [0] sizes, [1] starts, [2] done, [3] owners */
BPF_PERCPU_ARRAY(busy, u32, 1);  /* 1 while one of the tracepoint programs below runs */
BPF_ARRAY(nested, u64, 2);  /* events that fired on a busy CPU: [0] issues, [1] completions */

static __always_inline void set_busy(u32 v)
{
#if !NESTED
    return;  /* the kernel counts the skipped events itself (recursion_misses) */
#endif
    int zero = 0;
    u32 *b = busy.lookup(&zero);
    if (b)
        *b = v;
}

static __always_inline void count_nested(int which)
{
    int zero = 0;
    u32 *b = busy.lookup(&zero);
    if (b && *b) {
        u64 *n = nested.lookup(&which);
        if (n)
            __sync_fetch_and_add(n, 1);
    }
}

/* 0: not traced; else 1 + the device's row, or NO_ROW */
static __always_inline u32 traced(u32 dev)
{
#if FILTER && SLOT_DEVS
    /* the devices with a row, compiled in: compared without a map lookup */
    u32 rows[SLOT_DEVS] = DEVS;
#pragma unroll
    for (int i = 0; i < SLOT_DEVS; i++)
        if (rows[i] == dev)
            return i + 1;
#endif
#if FILTER
    u32 *row = devices.lookup(&dev);
    return row ? *row : 0;
#else
    return NO_ROW;
#endif
}

static __always_inline u32 op_class(char c, char next)
{
    /* blk_fill_rwbs(): 'F' first is REQ_PREFLUSH when an op letter follows ("FWS");
     * alone (or "FF") it is a flush request */
    if (c == 'F' && (next == 'R' || next == 'W' || next == 'D' || next == 'N' || next == 'F'))
        c = next;
    switch (c) {
    case 'R': return OP_READ;
    case 'W': return OP_WRITE;
    case 'D': return OP_DISCARD;
    case 'F': return OP_FLUSH;
    default:  return OP_OTHER;
    }
}

static __always_inline void count_drop(int which)
{
    u64 *d = dropped.lookup(&which);
    if (d)
        __sync_fetch_and_add(d, 1);
}

/* add `delta` to the (dev, op, size) counter; an issue creates a missing entry (a full map
 * is counted in `dropped`), a requeue only takes back what exists. The log2 histogram is
 * derived from these exact counts in user space: one map update per request, not two */
static __always_inline void bump(u32 row, u32 dev, u32 op, u32 bytes, u64 delta, bool create)
{
    u64 zero = 0, *val;
#if SLOT_DEVS
    if (row <= SLOT_DEVS && op <= OP_WRITE && !(bytes & 511) && (bytes >> 9) <= SLOT_SECTORS) {
        u32 i = ((row - 1) * 2 + op) * (SLOT_SECTORS + 1) + (bytes >> 9);
        val = slots.lookup(&i);
        if (val)
            __sync_fetch_and_add(val, delta);
        return;
    }
#endif
    struct size_key sk = {.dev = dev, .op = op, .bytes = bytes};
    val = sizes.lookup(&sk);
    if (!val && create) {
        sizes.insert(&sk, &zero);  /* -EEXIST on a race is fine: the lookup below finds it */
        val = sizes.lookup(&sk);
        if (!val)
            count_drop(0);
    }
    if (val)
        __sync_fetch_and_add(val, delta);
}

#if TIMED
/* the latency arrays, by name for add_at() (bcc takes no map in a macro or a pointer) */
#define A_INFLIGHT 0
#define A_DEPTH 1
#define A_LAT 2
#define A_QLAT 3

/* add *delta* to the u64 at index *i* of one of the latency arrays */
static __always_inline void add_at(int which, u32 i, u64 delta)
{
    u64 *v;
    if (which == A_INFLIGHT)
        v = inflight.lookup(&i);
    else if (which == A_DEPTH)
        v = depth.lookup(&i);
    else if (which == A_LAT)
        v = lat.lookup(&i);
    else
        v = qlat.lookup(&i);
    if (v)
        __sync_fetch_and_add(v, delta);
}
#endif

#if TIMED
/* an issue of a request of *row*: its start time kept, the drive's depth counted */
static __always_inline void timed_issue(u32 row, struct start_key *k, u32 op, u32 bytes,
                                        u64 now)
{
    if (row > SLOT_DEVS)
        return;
    struct start_val v = {.ns = now, .bytes = bytes, .op = op};
    u32 base = (row - 1) * INFLIGHT_WORDS;
    int err = starts.insert(k, &v);
    if (err == -17) {  /* -EEXIST: issued again before a completion was seen */
        starts.update(k, &v);
        add_at(A_INFLIGHT, base + IN_REISSUED, 1);
        return;
    }
    if (err) {
        count_drop(1);
        return;
    }
    u64 *n = inflight.lookup(&base);
    if (!n)
        return;
    u64 d = __sync_fetch_and_add(n, 1) + 1;
    add_at(A_DEPTH, (row - 1) * DEPTH_SLOTS + (d < DEPTH_SLOTS ? (u32)d : DEPTH_SLOTS - 1), 1);
}

/* a completion (*done*) or a requeue of a request of *row*: its time in flight ends */
static __always_inline void timed_end(u32 row, struct start_key *k, bool done, u64 now)
{
    if (row > SLOT_DEVS)
        return;
    struct start_val *v = starts.lookup(k);
    if (!v)
        return;
    u64 ns = now - v->ns;
    u32 op = v->op, bytes = v->bytes;
    starts.delete(k);
    u32 base = (row - 1) * INFLIGHT_WORDS;
    add_at(A_INFLIGHT, base, (u64)-1);
    if (!done)
        return;
    add_at(A_INFLIGHT, base + IN_BUSY + (op <= OP_WRITE ? op + 1 : 0), ns);
    if (op <= OP_WRITE)
        add_at(A_LAT, (((row - 1) * 2 + op) * 2 + (bytes != FOCUS_BYTES)) * LAT_SLOTS + lat_slot(ns),
               1);
}
#endif

#if BTF_TP
/* BTF tracepoint programs (iotune/trace/btf.py loads and attaches them): the tracepoint's
 * own arguments, read with plain loads at offsets from the running kernel's BTF (RQ_*,
 * Q_DISK, GD_*, BIO_*, BDEV_DISK: bytes) and classed by its enum req_op (REQ_OP_*_V) */
#define FIELD(type, base, off) (*(type *)((char *)(base) + (off)))

/* disk_devt(): major << 20 | first_minor, 0 without a disk (as the tracepoints report) */
static __always_inline u32 disk_dev(char *disk)
{
    if (!disk)
        return 0;
    return (FIELD(u32, disk, GD_MAJOR) << 20) | FIELD(u32, disk, GD_FIRST_MINOR);
}

static __always_inline u32 rq_dev(char *rq)
{
    return disk_dev(FIELD(char *, FIELD(char *, rq, RQ_Q), Q_DISK));
}

#if ONLY
/* with a filter (ONLY): the bios the workload or the cgroup (and those below it) submitted, by
 * address, from block_bio_queue until the completion of the request they start */
BPF_TABLE("lru_hash", u64, u8, mine_bios, MINE_BIOS);
#endif

/* with a filter: whether request *rq* is the workload's (its first bio was); *done*: its
 * completion, which forgets the bio */
static __always_inline bool passes(char *rq, bool done)
{
#if ONLY
    u64 bio = (u64)FIELD(char *, rq, RQ_BIO);
    if (!bio || !mine_bios.lookup(&bio))
        return false;
    if (done)
        mine_bios.delete(&bio);
#endif
    return true;
}

/* the class blk_fill_rwbs() gives an op ("F" for a pre-flush flag aside): write zeroes,
 * like every op it names "N", are "other" */
static __always_inline u32 req_class(u32 opf)
{
    u32 op = opf & 0xff;  /* REQ_OP_MASK */
    if (op == REQ_OP_READ_V)
        return OP_READ;
    if (op == REQ_OP_WRITE_V)
        return OP_WRITE;
    if (op == REQ_OP_DISCARD_V || op == REQ_OP_SECURE_ERASE_V)
        return OP_DISCARD;
    if (op == REQ_OP_FLUSH_V)
        return OP_FLUSH;
    return OP_OTHER;
}

int btf__block_rq_issue(unsigned long long *ctx)
{
    char *rq = (char *)ctx[0];
    u32 dev = rq_dev(rq), row = traced(dev);
    if (!row || !passes(rq, false))
        return 0;
    u32 op = req_class(FIELD(u32, rq, RQ_CMD_FLAGS)), bytes = FIELD(u32, rq, RQ_DATA_LEN);
    bump(row, dev, op, bytes, 1, true);
#if TIMED
    if (row <= SLOT_DEVS) {
        struct start_key k = {.id = (u64)rq};
        u64 now = bpf_ktime_get_ns(), *q = queued.lookup(&k);
        if (q) {  /* inserted while traced: its wait before the driver */
            if (op <= OP_WRITE)
                add_at(A_QLAT, ((row - 1) * 2 + op) * LAT_SLOTS + lat_slot(now - *q), 1);
            queued.delete(&k);
        }
        timed_issue(row, &k, op, bytes, now);
    }
#endif
    return 0;
}

/* blk_rq_bytes() of the requeued request: what its issue reported */
int btf__block_rq_requeue(unsigned long long *ctx)
{
    char *rq = (char *)ctx[0];
    u32 dev = rq_dev(rq), row = traced(dev);
    if (!row || !passes(rq, false))
        return 0;
    bump(row, dev, req_class(FIELD(u32, rq, RQ_CMD_FLAGS)), FIELD(u32, rq, RQ_DATA_LEN), (u64)-1,
         false);
#if TIMED
    struct start_key k = {.id = (u64)rq};
    timed_end(row, &k, false, bpf_ktime_get_ns());
#endif
    return 0;
}

/* a request put in a scheduler's queue or a plug's list before the driver takes it */
int btf__block_rq_insert(unsigned long long *ctx)
{
#if TIMED
    char *rq = (char *)ctx[0];
    u32 row = traced(rq_dev(rq));
    if (row && row <= SLOT_DEVS) {
        struct start_key k = {.id = (u64)rq};
        u64 now = bpf_ktime_get_ns();
        queued.update(&k, &now);
    }
#endif
    return 0;
}
#else
TRACEPOINT_PROBE(block, block_rq_issue)
{
    set_busy(1);
    u32 dev = args->dev, row = traced(dev);
    if (row) {
        u32 op = op_class(args->rwbs[0], args->rwbs[1]);
        bump(row, dev, op, args->bytes, 1, true);
#if TIMED
        struct start_key k = {.id = dev, .sector = args->sector};
        timed_issue(row, &k, op, args->bytes, bpf_ktime_get_ns());
#endif
    }
    set_busy(0);
    return 0;
}

/* the same key as its issue: block_rq_requeue has no bytes field, but an untouched requeued
 * request's nr_sector << 9 is the blk_rq_bytes() its issue reported (0 for a flush) */
TRACEPOINT_PROBE(block, block_rq_requeue)
{
    set_busy(1);
    u32 dev = args->dev, row = traced(dev);
    if (row) {
        bump(row, dev, op_class(args->rwbs[0], args->rwbs[1]), args->nr_sector << 9, (u64)-1,
             false);
#if TIMED
        struct start_key k = {.id = dev, .sector = args->sector};
        timed_end(row, &k, false, bpf_ktime_get_ns());
#endif
    }
    set_busy(0);
    return 0;
}

#endif

static __always_inline void count_done(u32 row, u32 dev, u32 op, u32 nr_sector, u64 sector,
                                       char zeroes)
{
    struct done_key k = {.dev = dev, .op = op};
    /* blk_insert_flush() clears REQ_PREFLUSH once it has planned the flush, so the empty
     * write completes as a plain "W" of no data: the only writes that carry none, besides
     * the final end of a sequenced data write (iotune.h), which sits past its data */
    if (k.op == OP_WRITE && nr_sector == 0 && !zeroes)
        k.op = sector ? OP_FLUSH_SEQ_DONE : OP_EMPTY_PREFLUSH;
    struct done_val zero = {}, *val;
#if SLOT_DEVS
    if (row <= SLOT_DEVS && k.op < DONE_OPS) {
        u32 i = (row - 1) * DONE_OPS + k.op;
        val = dones.lookup(&i);
        if (val) {
            __sync_fetch_and_add(&val->ios, 1);
            __sync_fetch_and_add(&val->sectors, nr_sector);
        }
        return;
    }
#endif
    val = done.lookup(&k);
    if (!val) {
        done.insert(&k, &zero);
        val = done.lookup(&k);
        if (!val) {
            count_drop(2);
            return;
        }
    }
    __sync_fetch_and_add(&val->ios, 1);
    /* nr_sector here is the completed bytes >> 9, as blk_account_io_completion() adds */
    __sync_fetch_and_add(&val->sectors, nr_sector);
}

#if BTF_TP
/* (rq, error, nr_bytes): the tracepoint's nr_sector is nr_bytes >> 9, its sector
 * blk_rq_pos() */
int btf__block_rq_complete(unsigned long long *ctx)
{
    char *rq = (char *)ctx[0];
    u32 dev = rq_dev(rq), row = traced(dev);
    if (row && passes(rq, true)) {
        u32 opf = FIELD(u32, rq, RQ_CMD_FLAGS);
        count_done(row, dev, req_class(opf), (u32)ctx[2] >> 9, FIELD(u64, rq, RQ_SECTOR), 0);
#if TIMED
        struct start_key k = {.id = (u64)rq};
        timed_end(row, &k, true, bpf_ktime_get_ns());
#endif
    }
    return 0;
}
#else
TRACEPOINT_PROBE(block, block_rq_complete)
{
    set_busy(1);
    u32 dev = args->dev, row = traced(dev);
    if (row) {
        count_done(row, dev, op_class(args->rwbs[0], args->rwbs[1]), args->nr_sector,
                   args->sector, args->rwbs[0] == 'W' && args->rwbs[1] == 'Z');
#if TIMED
        struct start_key k = {.id = dev, .sector = args->sector};
        timed_end(row, &k, true, bpf_ktime_get_ns());
#endif
    }
    set_busy(0);
    return 0;
}

#endif

/* no fields read (struct request's layout is the running kernel's, not the headers'): only
 * whether the event fired while a program above ran on this CPU, so was not delivered to it */
#if NESTED
RAW_TRACEPOINT_PROBE(block_rq_issue)
{
    count_nested(0);
    return 0;
}

RAW_TRACEPOINT_PROBE(block_rq_complete)
{
    count_nested(1);
    return 0;
}
#endif

#if OWNERS
BPF_HASH(workload, u32, u8, 65536);
BPF_HASH(owners, struct owner_key, struct owner_val, 4096);
BPF_HASH(comms, u32, struct comm_val, 1024);
#if SLOT_DEVS
BPF_F_TABLE("array", u32, struct owner_val, wowners, SLOT_DEVS * OWNER_OPS, (1U << 10));
#endif
#if ONLY == ONLY_CGROUP
/* the cgroup named, in slot 0: its processes are mostly in the cgroups below it (under cgroup
 * v2 a cgroup with controllers enabled holds none itself: a pod, a slice) */
BPF_CGROUP_ARRAY(only_cgroup, 1);
#endif

/* Whether a tgid is the workload's, without a hash lookup per bio: each CPU remembers its
 * last answer, valid while the workload set has not grown (`generation`, bumped by every
 * addition; user space starts it at 1, so a CPU's zeroed memory is never valid). */
struct mine_cache {
    u32 tgid;
    u32 mine;
    u64 generation;
};
BPF_PERCPU_ARRAY(mine_last, struct mine_cache, 1);
BPF_ARRAY(generation, u64, 1);

static __always_inline bool is_workload(u32 tgid)
{
    int zero = 0;
    u64 *gen = generation.lookup(&zero);
    struct mine_cache *c = mine_last.lookup(&zero);
    if (!gen || !c)
        return workload.lookup(&tgid) != NULL;
    u64 g = *(volatile u64 *)gen;
    if (g && c->generation == g && c->tgid == tgid)
        return c->mine;
    bool mine = workload.lookup(&tgid) != NULL;
    c->tgid = tgid;
    c->mine = mine;
    c->generation = g;
    return mine;
}

static __always_inline void count_bio(struct owner_key *k, u32 nr_sector)
{
    struct owner_val zero = {}, *val = owners.lookup(k);
    if (!val) {
        owners.insert(k, &zero);
        val = owners.lookup(k);
        if (!val) {
            count_drop(3);
            return;
        }
    }
    __sync_fetch_and_add(&val->bios, 1);
    __sync_fetch_and_add(&val->sectors, nr_sector);
}

/* a bio of *dev* (bio_dev(): the whole disk's dev_t, the partition is remapped before
 * block_bio_queue fires), class *op*, *nr_sector* long, submitted by the current task */
static __always_inline void on_bio(u32 dev, u32 op, u32 nr_sector, u64 bio)
{
    u32 row = traced(dev);
    if (!row)
        return;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct owner_key k = {.dev = dev, .op = op};
#if ONLY == ONLY_CGROUP
    /* the submitter's cgroup is the one named or below it (bpf_current_task_under_cgroup():
     * 1 yes, 0 no, < 0 an empty slot). Its own cgroup's id alone would match only a cgroup
     * that holds processes itself; an ancestor's id at the named cgroup's level would need
     * that level, which a path under a cgroup namespace's mount does not tell */
    bool mine = only_cgroup.check_current_task(0) == 1;
#else
    bool mine = is_workload(tgid);
#endif
#if ONLY
    /* a bio's address is reused: forget what it was before */
    u8 one = 1;
    if (mine)
        mine_bios.update(&bio, &one);
    else
        mine_bios.delete(&bio);
#endif
#if SLOT_DEVS
    if (mine && row <= SLOT_DEVS) {
        /* the workload's bios: a plain array by device and op, as for the sizes */
        u32 i = (row - 1) * OWNER_OPS + k.op;
        struct owner_val *w = wowners.lookup(&i);
        if (w) {
            __sync_fetch_and_add(&w->bios, 1);
            __sync_fetch_and_add(&w->sectors, nr_sector);
        }
        return;
    }
#endif
    if (!mine) {
        k.tgid = tgid;
        struct comm_val c = {};
        bpf_get_current_comm(c.comm, sizeof(c.comm));  /* the tracepoint's comm */
        comms.insert(&tgid, &c);
    }
    count_bio(&k, nr_sector);
}

#if BTF_TP
int btf__block_bio_queue(unsigned long long *ctx)
{
    char *bio = (char *)ctx[0], *bdev = FIELD(char *, bio, BIO_BDEV);
    if (bdev)
        on_bio(disk_dev(FIELD(char *, bdev, BDEV_DISK)), req_class(FIELD(u32, bio, BIO_OPF)),
               FIELD(u32, bio, BIO_SIZE) >> 9, (u64)bio);
    return 0;
}
#else
TRACEPOINT_PROBE(block, block_bio_queue)
{
    set_busy(1);
    on_bio(args->dev, op_class(args->rwbs[0], args->rwbs[1]), args->nr_sector, 0);
    set_busy(0);
    return 0;
}
#endif

/* every process the workload creates joins it: ZenFlow's optimizer process, or a compiler the
 * workload starts, is the workload. The event fires in the creating task, whose process is
 * looked up: parent_pid names the creating thread, which may be any thread of a workload
 * process (one that existed before the trace, whose id was never added, included). A new
 * thread's id is added too (the event does not say whether the child is a thread): harmless,
 * as a thread's bios are looked up by its process's id */
TRACEPOINT_PROBE(sched, sched_process_fork)
{
    set_busy(1);
    u32 parent = bpf_get_current_pid_tgid() >> 32, child = args->child_pid;
    u8 one = 1;
    if (workload.lookup(&parent)) {
        workload.update(&child, &one);
        int zero = 0;
        u64 *gen = generation.lookup(&zero);
        if (gen)
            __sync_fetch_and_add(gen, 1);
    }
    set_busy(0);
    return 0;
}
#endif
