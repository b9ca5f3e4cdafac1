// SPDX-License-Identifier: GPL-2.0
// The least a tracer that times every request from its issue to its completion and counts
// the drive's depth at each issue must run (benchmarks/latency_cost.py --floor): one pair of
// BTF programs on block_rq_issue and block_rq_complete per variant (-DVARIANT=...):
//   EMPTY  the programs return at once (what attaching a program costs);
//   CLOCK  each reads the kernel's clock (bpf_ktime_get_ns), as any issue-to-completion
//          timing must, and keeps it;
//   FLOOR  CLOCK, and one atomic add on a counter every CPU shares (+1 at issue, -1 at
//          completion): the requests in flight, which a depth at each issue needs.
// None keeps the issue's time for its completion, finds the request's device or counts a
// size: every real tracer does more.
typedef unsigned int u32;
typedef unsigned long long u64;
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

struct request;

char LICENSE[] SEC("license") = "GPL";

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} kept SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, u32);
    __type(value, u64);
} inflight SEC(".maps");

static __always_inline void body(long delta)
{
#if defined(CLOCK) || defined(FLOOR)
    u32 zero = 0;
    u64 *k = bpf_map_lookup_elem(&kept, &zero);
    if (k)
        *k = bpf_ktime_get_ns();
#endif
#ifdef FLOOR
    u64 *n = bpf_map_lookup_elem(&inflight, &zero);
    if (n)
        __sync_fetch_and_add(n, delta);
#endif
}

#define PAIR(prefix)                                                   \
    SEC("tp_btf/block_rq_issue")                                       \
    int BPF_PROG(prefix##_issue, struct request *rq)                   \
    {                                                                  \
        body(1);                                                       \
        return 0;                                                      \
    }                                                                  \
    SEC("tp_btf/block_rq_complete")                                    \
    int BPF_PROG(prefix##_done, struct request *rq, int err, u32 n)    \
    {                                                                  \
        body(-1);                                                      \
        return 0;                                                      \
    }

#if defined(EMPTY)
PAIR(floor_empty)
#elif defined(CLOCK)
PAIR(floor_clock)
#else
PAIR(floor_depth)
#endif
