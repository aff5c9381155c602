"""Lecture 03's pieces that later lectures reuse, exactly as notebooks/03_benchmarking.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.saved`: edit the lecture, then run it again."""



def assert_busbw_reads_the_link(rows, gbps, lowest=0.8):
    """A ring on links of `gbps` GB/s: busbw is at most gbps (each step's bytes take
    that long at least), at least `lowest` x gbps (the rest: real transfer, alpha)."""
    for r in rows:
        assert r["wrong"] == 0 and lowest * gbps <= r["busbw"] <= 1.01 * gbps, \
            f"K={r['world_size']}: busbw {r['busbw']:.4g} GB/s on a {gbps} GB/s link"

def chain_ratio(k, n):
    """A chain broadcast, one hop per message: one call's latency (the last rank's
    K-1 hops) over the loop's time per call (ranks' mean: 1 + (K-2)(K+1)/(2Kn) hops)."""
    return (k - 1) / (1 + (k - 2) * (k + 1) / (2 * k * n))


def assert_latency_is_not_throughput(loop_rows, per_call_rows, n, rtol=0.15):
    """Per call (median) over the loop's time per call, K by K, against chain_ratio."""
    for a, b in zip(loop_rows, per_call_rows):
        k, got = a["world_size"], b["time_us"] / a["time_us"]
        model = chain_ratio(k, n)
        assert a["wrong"] == b["wrong"] == 0 and abs(got / model - 1) <= rtol, \
            f"K={k}: per call / loop = {got:.3f}, the model {model:.3f}"
