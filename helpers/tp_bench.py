"""Lecture 07's measuring machinery (tensor parallelism): the split-matmul picture, and what one rank
measures around a split block it is given (counted flops and bytes, the median step with and
without its all-reduces, one all-reduce alone). It wraps the lecture's plain code; it holds none.
"""
import functools
import statistics

import torch
import torch.distributed as dist
from matplotlib.patches import Rectangle
from torch.utils.flop_counter import FlopCounterMode

from helpers import ddp_bench, plots, timing


def draw_split(ax, kind, K=4):
    """X (tokens x in) @ W^T (in x out) = Y, coloured by the rank that holds each piece."""
    def box(x0, w, h, label, split=None):
        if split is None:
            ax.add_patch(Rectangle((x0, 0), w, h, fc="0.85", ec="k"))
        for k in range(K if split else 0):
            xy, wh = (((x0 + k * w / K, 0), (w / K, h)) if split == "cols"
                      else ((x0, h - (k + 1) * h / K), (w, h / K)))
            ax.add_patch(Rectangle(xy, *wh, fc=plots.COLORS[k], ec="k", alpha=0.7))
        ax.text(x0 + w / 2, -0.4, label, ha="center", va="top")
    if kind == "column":
        box(0, 2, 3, "X\n(replicated)")
        box(2.6, 3, 2, "W$^T$: columns\nsplit", "cols")
        box(6.2, 3, 3, "Y: feature\nslices", "cols")
        ax.set_title("column-parallel: no communication forward")
    else:
        box(0, 2, 3, "X: feature\nslices", "cols")
        box(2.6, 2, 2, "W$^T$: rows\nsplit", "rows")
        box(5.6, 2, 3, "Y = sum of K\npartial products")
        ax.set_title("row-parallel: all-reduce of partial sums")
    ax.text(2.3, 1.5, "@", ha="center", va="center", fontsize=14)
    ax.set_xlim(-0.3, 9.5); ax.set_ylim(-1.6, 3.3); ax.axis("off"); ax.set_aspect("equal")


def counted(blk, x):
    """Parameter bytes, bytes autograd saves for backward (parameters aside), and the matmul
    flops of one forward + backward (FlopCounterMode) of `blk` on `x`."""
    params = {p.data_ptr() for p in blk.parameters()}
    saved = []

    def pack(t):
        saved.append(0 if t.data_ptr() in params else t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = blk(x)
    del y
    with FlopCounterMode(display=False) as counter:
        blk(x).sum().backward()
    return dict(param_bytes=sum(p.numel() * p.element_size() for p in blk.parameters()),
                act_bytes=sum(saved), flops=counter.get_total_flops())


def timed(blk, x, iters):
    """Median seconds (this rank) of a forward + backward step: as it is, with every
    dist.all_reduce a no-op (compute alone: wrong values, right work), of one all-reduce of a
    tensor like x alone, and the time a step's all-reduces waited for the last rank (`wait`).
    A barrier before each measurement."""
    def step():
        blk.zero_grad(set_to_none=True)
        blk(x).sum().backward()

    def median(fn, context=None):
        dist.barrier()
        if context is None:
            return timing.summary(timing.measure(fn, warmup=2, iters=iters))["median"]
        with context():
            return timing.summary(timing.measure(fn, warmup=2, iters=iters))["median"]

    def waited():
        """Seconds this rank's all-reduces of one step waited for the last rank to launch them
        (ddp_bench's launch stamps, perf_counter being one clock for the machine)."""
        dist.barrier()
        with ddp_bench.paced_all_reduce(1e12) as link:       # a link that takes no time
            step()
        return sum(c["start"] - c["launch"] for c in link.calls)

    msg = torch.randn_like(x)
    waits = [waited() for _ in range(iters)]
    return dict(step=median(step), compute=median(step, ddp_bench.without_all_reduce),
                all_reduce=median(lambda: dist.all_reduce(msg)), wait=statistics.median(waits))


def paced_steps(step, gbps, alpha_s, steps, warmup=2):
    """In a rank: seconds of each `step()` with every all-reduce on the paced link
    (ddp_bench.paced_all_reduce) and with none (ddp_bench.without_all_reduce), taking turns."""
    link = functools.partial(ddp_bench.paced_all_reduce, gbps, alpha_s)
    return ddp_bench.time_steps({"paced": (step, link),
                                 "no communication": (step, ddp_bench.without_all_reduce)},
                                steps, warmup)


def slowest_median(per_rank):
    """{variant: median over steps of the slowest rank's seconds} of paced_steps' results."""
    return {name: statistics.median(ddp_bench.slowest_rank(per_rank, name))
            for name in per_rank[0]}
