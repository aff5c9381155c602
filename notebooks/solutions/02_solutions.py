"""Reference solutions for the exercises of lecture 02 (NCCL ring math)."""
import math


def chunked_broadcast_time(n, k, s, bw, alpha):
    """Seconds for a broadcast of n bytes on a ring of k ranks, cut into s chunks.

    K-2+S steps (the last chunk leaves the root at step S and needs K-2 more hops), each moving
    one chunk of n/s bytes and paying the latency once.
    """
    return (k - 2 + s) * (alpha + n / (s * bw))


def best_chunk_count(n, k, bw, alpha):
    """The integer S >= 1 with the smallest (K-2+S)(alpha + N/(S B))."""
    if k <= 2 or alpha <= 0:
        return 1 if k <= 2 else max(1, int(n))  # no pipeline to fill / no cost per chunk
    s_star = math.sqrt((k - 2) * n / (alpha * bw))
    candidates = {max(1, math.floor(s_star)), max(1, math.ceil(s_star))}
    return min(sorted(candidates), key=lambda s: chunked_broadcast_time(n, k, s, bw, alpha))


def reduce_scatter_send_chunk(rank, step, k):
    """The chunk `rank` sends right in reduce-scatter step `step`, so that rank r ends with chunk r."""
    return (rank - step - 1) % k


def ring_bytes_sent(n, k):
    """Bytes one rank sends in a ring all-reduce: 2(K-1) steps of n/k bytes."""
    return 2 * (k - 1) * n / k
