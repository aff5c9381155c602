"""Lecture 03's pieces that later lectures reuse, exactly as notebooks/03_benchmarking.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
from helpers import cost, plots


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

def assert_the_copy_sets_the_loop(rows, d2d_gbps, rtol=0.10):
    """One GPU (K=1), the largest size: the loop's time per call of the out-of-place
    all-gather and reduce-scatter is one copy, 2n bytes (read, written) at d2d_gbps
    (lecture 00's device-to-device rate, 2n/t); the host's cost hides behind it."""
    n = max(r["size"] for r in rows)
    out = [r for r in rows if r["world_size"] == 1 and r["size"] == n
           and r["method"] == "nccl-tests"
           and r["collective"] in ("all_gather", "reduce_scatter")]
    assert len(out) == 2, "no K=1 all-gather and reduce-scatter at the largest size"
    model = 2 * n / (d2d_gbps * 1e9) * 1e6
    for r in out:
        assert abs(r["time_us"] / model - 1) <= rtol, (r["collective"], model)
    return [{"collective": r["collective"], "n": plots.bytes_label(n),
             "loop us": r["time_us"], "2n/D2D us": model} for r in out]

def assert_nccl_tests_definitions(rows, k, collective="all_reduce", rtol=0.01):
    """Rows (bytes, time us, algbw, busbw) of an nccl-tests table on k ranks, from
    1 MiB: algbw = S/t and busbw = algbw x the collective's factor, within rtol."""
    factor = cost.busbw_factor(collective, k)
    for size, t_us, algbw, bus in (r for r in rows if r[0] >= 2**20):
        assert abs(algbw - size / t_us / 1e3) <= rtol * algbw, (size, algbw)
        assert abs(bus - factor * algbw) <= rtol * bus, (size, bus, factor * algbw)
