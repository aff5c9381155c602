"""Lecture 00's pieces that later lectures reuse, exactly as notebooks/00_hardware.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import statistics
import torch
import torch.distributed as dist
from helpers import bench, cost


def ping_pong(send, recv):
    """Rank 0 sends `send` to rank 1, which receives it into `recv` and answers with
    its own `send`; rank 0 receives the answer into `recv`. One round trip: two one-way
    messages."""
    if dist.get_rank() == 0:
        dist.send(send, 1)
        dist.recv(recv, 1)
    else:
        dist.recv(recv, 0)
        dist.send(send, 0)


def measure_link(sizes, rounds=5, iters=10):
    """The series' alpha and B of the link between two ranks: t = alpha + n/B fitted to
    the one-way time of an n-byte message, half a ping-pong round trip, timed as
    nccl-tests times (lecture 03's harness: one barrier, `iters` round trips back to
    back, the ranks' mean, the median of `rounds`); the last call of each size is
    checked (#wrong). Returns (the fit, the harness's rows: times of round trips)."""
    rows = bench.sweep({"ping-pong": ("send_recv", ping_pong)}, world_sizes=[2],
                       sizes=sizes, warmup=2, iters=iters, rounds=rounds,
                       progress=False)
    assert all(r["wrong"] == 0 for r in rows), "a message arrived wrong"
    one_way = [r["time_us"] * 1e-6 / 2 for r in rows]
    return cost.fit_alpha_beta([r["size"] for r in rows], one_way), rows


def bootstrap_fits(rows, draws=200, seed=0):
    """measure_link's fit redone on its rounds drawn again with replacement (bootstrap;
    rows' `times_us` hold one round trip per round): each draw takes as many rounds as
    were run, the median per size, the same fit. Returns the `draws` Fits, whose alphas
    and Bs spread as far as the rounds leave the fit uncertain."""
    generator = torch.Generator().manual_seed(seed)
    rounds, sizes = len(rows[0]["times_us"]), [r["size"] for r in rows]
    fits = []
    for _ in range(draws):
        drawn = torch.randint(rounds, (rounds,), generator=generator).tolist()
        one_way = [statistics.median(r["times_us"][j] for j in drawn) * 1e-6 / 2
                   for r in rows]
        fits.append(cost.fit_alpha_beta(sizes, one_way))
    return fits

def link_below_copy(link, copy_gbps):
    """Lecture 00's claim for two ranks of one host on gloo: every byte is copied at
    least once on each side (into the kernel's socket buffer, out of it), and each copy
    moves its n bytes through DRAM, which serves one core about C = `copy_gbps` bytes a
    second (its DRAM copy rate 2S/t, in GB/s). So the link's fitted B is below C even
    if the two copies overlap. Returns B / C."""
    ratio = link.bandwidth / 1e9 / copy_gbps
    assert ratio < 1, f"B = {link.bandwidth / 1e9:.3g} GB/s, C = {copy_gbps:.3g} GB/s"
    return ratio
