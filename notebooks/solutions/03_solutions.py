"""Reference solutions for the exercises of lecture 03 (benchmarking collectives)."""
import statistics

import numpy as np


def chain_loop_hops(k, n, average):
    """A loop of n chain broadcasts: the root ends after n hops, rank j (1..k-2) after n+j (its
    last forward), the last rank with its predecessor, after n+k-2. Per call: / n; then -a."""
    ends = [n] + [n + j for j in range(1, k - 1)] + [n + k - 2]
    per_call = [e / n for e in ends]
    return {0: per_call[0], 1: sum(per_call) / k, 2: min(per_call), 3: max(per_call)}[average]


def two_fits(sizes, times):
    """Ordinary least squares, then relative (each row divided by its time), for t = a + b*n."""
    n = np.asarray(sizes, float)
    t = np.asarray(times, float)
    design = np.stack([np.ones_like(n), n], axis=1)
    ordinary = np.linalg.lstsq(design, t, rcond=None)[0]
    relative = np.linalg.lstsq(design / t[:, None], np.ones_like(t), rcond=None)[0]
    return tuple(map(float, ordinary)), tuple(map(float, relative))


def chunked_chain_ratio(k, n, s):
    """One call: the last chunk leaves the root after s chunk-hops and needs k-2 more, (k-2+s)/s
    hops. A loop: the root sends n*s chunks back to back (n hops), rank j ends j/s hops later
    (the last rank with rank k-2): the mean is n + (k-2)(k+1)/(2ks) hops, per call / n."""
    latency = (k - 2 + s) / s
    loop = 1 + (k - 2) * (k + 1) / (2 * k * n * s)
    return latency / loop


def median_of_slowest(times):
    """times[rank][call] -> the median over calls of the slowest rank's time."""
    return statistics.median(max(per_call) for per_call in zip(*times))
