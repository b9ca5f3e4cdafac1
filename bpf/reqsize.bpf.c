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
// Compile-time constants (bcc cflags): MAX_SIZES, MAX_HIST, FILTER (1: only devices in
// `devices` are counted).
#include "iotune.h"

BPF_HASH(sizes, struct size_key, u64, MAX_SIZES);
BPF_HASH(hist, struct hist_key, u64, MAX_HIST);
BPF_HASH(devices, u32, u8, 1024);
BPF_ARRAY(dropped, u64, 2);  /* [0] sizes map full, [1] hist map full */

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
