"""Cost models of collectives, and fitting t = a + b*n to measured times.

Every function takes the message size `n` in bytes, the number of ranks `k`, the link bandwidth `bw`
in bytes per second and, where it matters, the per-message latency `alpha` in seconds; it returns
seconds. The models are those of the measurement conventions (nccl-tests' README, "Performance"):

    ring broadcast            (K-1) N/B
    chunked ring broadcast    (K-2+S) (alpha + N/(S B))          -> N/B for many chunks
    ring reduce-scatter       (K-1) (alpha + N/(K B))            (also ring all-gather)
    ring all-reduce           2(K-1) (alpha + N/(K B))           -> 2(K-1)/K N/B
    naive all-reduce          2(K-1) (alpha + N/B)               (reduce to a root, broadcast back)
    tree all-reduce           a binary tree, not pipelined, one port per rank (tree_all_reduce)
    pipelined tree all-reduce NCCL's double binary tree: (sqrt((2D-1) alpha) + sqrt(M/B))^2,
                              D = floor(log2 K) levels, M = 2N (N when K = 2) through the
                              busiest port (pipelined_tree_all_reduce)
    in-network all-reduce     2 alpha + N/B                      (NVLS, SHARP: the switch adds)

Every model has one port per rank: a rank sends one message and receives one message at a time,
each direction at B (full duplex), as NCCL's and nccl-tests' models assume.

busbw factors (algbw x factor = busbw) are nccl-tests' (doc/PERFORMANCE.md):
all_reduce 2(K-1)/K, reduce_scatter, all_gather and all_to_all (K-1)/K, broadcast, reduce,
send/recv 1.
"""
import math

import numpy as np

GB = 1e9  # nccl-tests report GB/s with GB = 1e9 bytes


# ------------------------------------------------------------------------------- the ring models

def ring_broadcast(n, k, bw, alpha=0.0):
    """Unchunked broadcast along a ring: the whole message hops K-1 times."""
    return (k - 1) * (alpha + n / bw)


def chunked_ring_broadcast(n, k, s, bw, alpha=0.0):
    """Broadcast cut into s chunks that follow each other round the ring (a pipeline).

    The last chunk leaves the root after s steps and needs K-2 more hops: K-2+s steps of N/s bytes.
    """
    return (k - 2 + s) * (alpha + n / (s * bw))


def best_chunks(n, k, bw, alpha):
    """The chunk count that minimises chunked_ring_broadcast: sqrt((K-2) N / (alpha B)), at least 1.

    From d/ds [(K-2+s)(alpha + N/(sB))] = alpha - (K-2) N/(s^2 B) = 0.
    """
    if alpha <= 0:
        return math.inf
    return max(1.0, math.sqrt(max(k - 2, 0) * n / (alpha * bw)))


def ring_reduce_scatter(n, k, bw, alpha=0.0):
    """K-1 steps; in each every rank sends one of K chunks (N/K bytes) to its neighbour."""
    return (k - 1) * (alpha + n / (k * bw))


def ring_all_gather(n, k, bw, alpha=0.0):
    """Same traffic as the ring reduce-scatter, without the additions (n is the gathered size)."""
    return (k - 1) * (alpha + n / (k * bw))


def ring_all_reduce(n, k, bw, alpha=0.0):
    """Reduce-scatter then all-gather: 2(K-1) steps of N/K bytes, about 2 N/B for any K."""
    return 2 * (k - 1) * (alpha + n / (k * bw))


def naive_all_reduce(n, k, bw, alpha=0.0):
    """Every rank sends its whole buffer to a root (K-1 messages through one link), then back."""
    return 2 * (k - 1) * (alpha + n / bw)


def tree_all_reduce(n, k, bw, alpha=0.0):
    """Reduce up a binary tree (rank i's children 2i+1 and 2i+2), then broadcast down it, whole
    messages, one port per rank: a parent receives its children's messages one after the other, and
    sends the result to them one after the other: 4(log2 K - 1) (alpha + N/B) for K a power of two."""
    if k <= 1:
        return 0.0
    step = alpha + n / bw

    def reduced(i):  # when rank i holds the sum of its subtree
        done = sorted(reduced(c) for c in (2 * i + 1, 2 * i + 2) if c < k)
        t = 0.0
        for ready in done:  # one message at a time through the parent's port
            t = max(t, ready) + step
        return t

    def received(i, start):  # when the last rank of i's subtree has the result, i holding it at start
        children = [c for c in (2 * i + 1, 2 * i + 2) if c < k]
        return max([start] + [received(c, start + (j + 1) * step) for j, c in enumerate(children)])

    return received(0, reduced(0))


def pipelined_tree_all_reduce(n, k, bw, alpha=0.0):
    """NCCL's double binary tree (NCCL 2.4), pipelined: two binary trees over the K ranks, each
    reducing half the data up and broadcasting the sum down, cut into S chunks that follow each
    other level by level (as the chunked ring broadcast's do). Every rank is an inner node of one
    tree and a leaf of the other, so the busiest rank's port carries M = 2N each way (two
    children's halves up and one half down in its inner tree, one half down in the other; N
    when K = 2). A chunk crosses D = floor(log2 K) levels up and D down (the depth of a binary
    tree of K ranks filled level by level, as tree_all_reduce's): 2D - 1 + S steps of
    alpha + M/(S B), at the best S (taken real, as best_chunks does):

        T = (sqrt((2D - 1) alpha) + sqrt(M / B))^2  ->  2 N / B when alpha = 0.

    Its latency grows with log2 K where the ring's grows with K, and its bandwidth term, 2N/B,
    is about the ring's 2(K-1)/K N/B: why NCCL runs it across nodes at scale (with a chain
    inside each node, which this model, one rank per node, leaves out)."""
    if k <= 1:
        return 0.0
    depth = int(k).bit_length() - 1       # floor(log2 K)
    busiest = n * min(2, k - 1)
    return (math.sqrt((2 * depth - 1) * alpha) + math.sqrt(busiest / bw)) ** 2


def in_network_all_reduce(n, k, bw, alpha=0.0):
    """The switch reduces (NVLink SHARP "NVLS" on NVSwitch, SHARP on InfiniBand switches, which
    NCCL drives as CollNet across nodes): each rank sends its N bytes once into the switch and
    receives the sum once, both directions at once, pipelined: about N/B, whatever K. Each rank moves
    N bytes each way instead of the ring's 2(K-1)/K N, so its busbw (computed with the ring's factor)
    can exceed the link's bandwidth."""
    return 2 * alpha + n / bw if k > 1 else 0.0


# ------------------------------------------------------------------------- algbw and busbw

def busbw_factor(collective, k):
    """nccl-tests' factor from algorithm bandwidth to bus bandwidth for `collective` on k ranks."""
    name = collective.replace("-", "_").lower()
    if name in ("all_reduce", "allreduce"):
        return 2 * (k - 1) / k
    if name in ("reduce_scatter", "reducescatter", "all_gather", "allgather", "all_to_all",
                "alltoall"):
        return (k - 1) / k
    if name in ("broadcast", "reduce", "send_recv", "sendrecv"):
        return 1.0
    raise ValueError(f"no busbw factor known for {collective!r}; known: all_reduce, reduce_scatter, "
                     "all_gather, broadcast, reduce, send_recv, all_to_all.")


BUSBW_FACTORS = {name: (lambda k, name=name: busbw_factor(name, k))
                 for name in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce",
                              "send_recv", "all_to_all")}


def algbw(n, seconds):
    """Algorithm bandwidth in GB/s: the buffer size over the time (nccl-tests' `algbw`)."""
    return n / seconds / GB


def busbw(collective, n, seconds, k):
    """Bus bandwidth in GB/s: algbw times the factor, comparable with a link's peak bandwidth."""
    return algbw(n, seconds) * busbw_factor(collective, k)


# ------------------------------------------------------------------------ the alpha-beta fit

class Fit:
    """t = alpha + beta*n fitted to measurements: alpha (s), beta (s/byte), bandwidth 1/beta (B/s)."""

    def __init__(self, alpha, beta, sizes, times):
        self.alpha, self.beta = float(alpha), float(beta)
        self.sizes, self.times = np.asarray(sizes, float), np.asarray(times, float)

    @property
    def bandwidth(self):
        """The asymptotic bandwidth 1/beta in bytes per second."""
        return 1.0 / self.beta if self.beta > 0 else math.inf

    @property
    def half_size(self):
        """n_1/2 = alpha/beta: the size at which half of the asymptotic bandwidth is reached."""
        return self.alpha / self.beta if self.beta > 0 else math.inf

    def predict(self, n):
        return self.alpha + self.beta * np.asarray(n, float)

    def relative_errors(self):
        """|model - measured| / measured at each fitted size."""
        return np.abs(self.predict(self.sizes) - self.times) / self.times

    def median_relative_error(self):
        return float(np.median(self.relative_errors()))

    def __repr__(self):
        return (f"Fit(alpha={self.alpha * 1e6:.3g} us, bandwidth={self.bandwidth / GB:.3g} GB/s, "
                f"n_1/2={self.half_size:.3g} B, median rel. error={self.median_relative_error():.1%})")


def fit_alpha_beta(sizes, times, relative=True):
    """Least-squares fit of t = a + b*n; returns a Fit.

    relative=True minimises the squared *relative* residuals sum(((a + b n - t)/t)^2), so that
    sizes spanning several decades count alike (plain least squares is ruled by the largest sizes
    and leaves the small ones, where alpha matters, badly fitted). Negative a or b are clipped to 0
    and the other coefficient refitted, so the model stays physical.
    """
    n = np.asarray(sizes, float)
    t = np.asarray(times, float)
    if n.shape != t.shape or n.size < 2:
        raise ValueError("fit_alpha_beta needs at least two (size, time) pairs of equal length.")
    w = 1.0 / t if relative else np.ones_like(t)
    design = np.stack([np.ones_like(n), n], axis=1) * w[:, None]
    (a, b), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if a < 0:  # a pure bandwidth model
        a, b = 0.0, float(np.sum(w * w * n * t) / np.sum(w * w * n * n))
    elif b < 0:  # a pure latency model
        a, b = float(np.sum(w * w * t) / np.sum(w * w)), 0.0
    return Fit(a, b, n, t)


def fit_busbw_curve(fit, sizes, collective, k):
    """The busbw (GB/s) that a fitted alpha-beta model predicts at `sizes`, for plotting."""
    sizes = np.asarray(sizes, float)
    return sizes / fit.predict(sizes) / GB * busbw_factor(collective, k)
