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
// Compile-time constants (bcc cflags): MAX_SIZES, MAX_HIST, FILTER (1: only devices in
// `devices` are counted), OWNERS (1: attribute bios to submitters).
#include "iotune.h"

BPF_HASH(sizes, struct size_key, u64, MAX_SIZES);
BPF_HASH(hist, struct hist_key, u64, MAX_HIST);
BPF_HASH(devices, u32, u8, 1024);
BPF_HASH(done, struct done_key, struct done_val, 4096);
BPF_ARRAY(dropped, u64, 4);  /* map full: [0] sizes, [1] hist, [2] done, [3] owners */

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

/* add `delta` to the (dev, op, size) counter and its log2 slot; an issue creates missing
 * entries (a full map is counted in `dropped`), a requeue only takes back what exists */
static __always_inline void bump(u32 dev, u32 op, u32 bytes, u64 delta, bool create)
{
    u64 zero = 0, *val;
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

    struct hist_key hk = {.dev = dev, .op = op, .slot = bytes ? bpf_log2l(bytes) : 0};
    val = hist.lookup(&hk);
    if (!val && create) {
        hist.insert(&hk, &zero);
        val = hist.lookup(&hk);
        if (!val)
            count_drop(1);
    }
    if (val)
        __sync_fetch_and_add(val, delta);
}

TRACEPOINT_PROBE(block, block_rq_issue)
{
    u32 dev = args->dev;
#if FILTER
    if (!devices.lookup(&dev))
        return 0;
#endif
    bump(dev, op_class(args->rwbs[0], args->rwbs[1]), args->bytes, 1, true);
    return 0;
}

/* the same key as its issue: block_rq_requeue has no bytes field, but an untouched requeued
 * request's nr_sector << 9 is the blk_rq_bytes() its issue reported (0 for a flush) */
TRACEPOINT_PROBE(block, block_rq_requeue)
{
    u32 dev = args->dev;
#if FILTER
    if (!devices.lookup(&dev))
        return 0;
#endif
    bump(dev, op_class(args->rwbs[0], args->rwbs[1]), args->nr_sector << 9, (u64)-1, false);
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete)
{
    u32 dev = args->dev;
#if FILTER
    if (!devices.lookup(&dev))
        return 0;
#endif
    struct done_key k = {.dev = dev, .op = op_class(args->rwbs[0], args->rwbs[1])};
    /* blk_insert_flush() clears REQ_PREFLUSH once it has planned the flush, so the empty
     * write completes as a plain "W" of no data: the only writes that carry none */
    if (k.op == OP_WRITE && args->nr_sector == 0)
        k.op = OP_EMPTY_PREFLUSH;
    struct done_val zero = {}, *val = done.lookup(&k);
    if (!val) {
        done.insert(&k, &zero);
        val = done.lookup(&k);
        if (!val) {
            count_drop(2);
            return 0;
        }
    }
    __sync_fetch_and_add(&val->ios, 1);
    /* nr_sector here is the completed bytes >> 9, as blk_account_io_completion() adds */
    __sync_fetch_and_add(&val->sectors, args->nr_sector);
    return 0;
}

#if OWNERS
BPF_HASH(workload, u32, u8, 65536);
BPF_HASH(owners, struct owner_key, struct owner_val, 4096);
BPF_HASH(comms, u32, struct comm_val, 1024);

/* bio_dev() is the whole disk's dev_t (the partition is remapped before this fires) */
TRACEPOINT_PROBE(block, block_bio_queue)
{
    u32 dev = args->dev;
#if FILTER
    if (!devices.lookup(&dev))
        return 0;
#endif
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct owner_key k = {.dev = dev, .op = op_class(args->rwbs[0], args->rwbs[1])};
    if (!workload.lookup(&tgid)) {
        k.tgid = tgid;
        struct comm_val c = {};
        __builtin_memcpy(c.comm, args->comm, sizeof(c.comm));
        comms.insert(&tgid, &c);
    }
    struct owner_val zero = {}, *val = owners.lookup(&k);
    if (!val) {
        owners.insert(&k, &zero);
        val = owners.lookup(&k);
        if (!val) {
            count_drop(3);
            return 0;
        }
    }
    __sync_fetch_and_add(&val->bios, 1);
    __sync_fetch_and_add(&val->sectors, args->nr_sector);
    return 0;
}

/* every task the workload creates, threads included (parent_pid is the creating thread),
 * joins it: ZenFlow's optimizer process, or a compiler the workload starts, is the workload */
TRACEPOINT_PROBE(sched, sched_process_fork)
{
    u32 parent = args->parent_pid, child = args->child_pid;
    u8 one = 1;
    if (workload.lookup(&parent))
        workload.update(&child, &one);
    return 0;
}
#endif
