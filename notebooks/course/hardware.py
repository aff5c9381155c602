"""Lecture 00's pieces that later lectures reuse, exactly as notebooks/00_hardware.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.saved`: edit the lecture, then run it again."""
import torch.distributed as dist
from helpers import bench, cost


def ping_pong(send, recv):
    """Rank 0 sends `send` to rank 1, which receives it into `recv` and answers with its own
    `send`; rank 0 receives the answer into `recv`. One round trip: two one-way messages."""
    if dist.get_rank() == 0:
        dist.send(send, 1)
        dist.recv(recv, 1)
    else:
        dist.recv(recv, 0)
        dist.send(send, 0)


def measure_link(sizes, rounds=5, iters=10):
    """The series' alpha and B of the link between two ranks: t = alpha + n/B fitted to the
    one-way time of an n-byte message, half a ping-pong round trip, timed as nccl-tests times
    (lecture 03's harness: one barrier, `iters` round trips back to back, the ranks' mean,
    the median of `rounds`), every message checked. Returns (the fit, the harness's rows)."""
    rows = bench.sweep({"ping-pong": ("send_recv", ping_pong)}, world_sizes=[2], sizes=sizes,
                       warmup=2, iters=iters, rounds=rounds, progress=False)
    assert all(r["wrong"] == 0 for r in rows), "a message arrived wrong"
    one_way = [r["time_us"] * 1e-6 / 2 for r in rows]
    return cost.fit_alpha_beta([r["size"] for r in rows], one_way), rows
