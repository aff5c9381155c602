"""Reference solutions for the exercises of lecture 02 (NCCL ring math)."""
import math

import torch
import torch.distributed as dist

from course.ring_math import exchange


def chunked_broadcast_time(n, k, s, bw, alpha):
    """Seconds for a broadcast of n bytes on a ring of k ranks, cut into s chunks: K-2+S steps
    (the last chunk leaves the root at step S and needs K-2 more hops), each moving one chunk of
    n/s bytes and paying the latency once."""
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


def tree_all_reduce(x):
    """In place: reduce up the binary tree rooted at rank 0 (rank i's children 2i+1, 2i+2), then
    send the sum back down. A parent takes its children one after the other (one port)."""
    rank, k = dist.get_rank(), dist.get_world_size()
    children = [c for c in (2 * rank + 1, 2 * rank + 2) if c < k]
    incoming = torch.empty_like(x)
    for child in children:
        dist.recv(incoming, child)
        x += incoming
    if rank > 0:
        parent = (rank - 1) // 2
        dist.send(x, parent)          # this subtree's sum up
        dist.recv(x, parent)          # everyone's sum down
    for child in children:
        dist.send(x, child)
    return x


def sliced_ring_all_reduce(x, n_slices=4):
    """The ring all-reduce of lecture 02, each step's chunk sent as n_slices slices, one exchange
    each: 2(K-1) n_slices exchanges of N/(K n_slices) bytes."""
    rank, k = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % k, (rank - 1) % k
    chunks = list(torch.tensor_split(x, k))
    incoming = torch.empty_like(chunks[0])
    for step in range(k - 1):                      # reduce-scatter
        send_c, recv_c = (rank - step - 1) % k, (rank - step - 2) % k
        into = incoming[:len(chunks[recv_c])]
        for out, got in zip(chunks[send_c].tensor_split(n_slices),
                            into.tensor_split(n_slices)):
            exchange(out, right, got, left)
        chunks[recv_c] += into
    for step in range(k - 1):                      # all-gather
        out, got = chunks[(rank - step) % k], chunks[(rank - step - 1) % k]
        for piece, slot in zip(out.tensor_split(n_slices), got.tensor_split(n_slices)):
            exchange(piece, right, slot, left)
    return x
