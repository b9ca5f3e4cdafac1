// Smallest useful program for `iotune doctor`: proves that bcc can compile, load and attach
// a program to the block:block_rq_issue tracepoint that the tracer depends on.
BPF_ARRAY(hits, u64, 1);

TRACEPOINT_PROBE(block, block_rq_issue)
{
    int key = 0;
    u64 *value = hits.lookup(&key);
    if (value)
        __sync_fetch_and_add(value, 1);
    return 0;
}
