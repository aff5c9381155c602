"""Lecture 07's measuring machinery (tensor parallelism): the split-matmul picture, and what one rank
measures around a split block it is given (counted flops and bytes, the step with and without
its all-reduces and one all-reduce alone, taking turns), and the step on the H100 model with
its check. It wraps the lecture's plain code; it holds none.
"""
import contextlib
import functools
import time

import torch
import torch.distributed as dist
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle
from torch.utils.flop_counter import FlopCounterMode

from helpers import plots, timing
from helpers.patching import patched
from machinery import l05_ddp as ddp_bench


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


def draw_splits(K=4):
    """The column-parallel and the row-parallel split side by side (draw_split)."""
    fig, axes = plots.figure(ncols=2, width=12, height=3)
    draw_split(axes[0], "column", K)
    draw_split(axes[1], "row", K)
    fig.suptitle(f"Colours: rank 0..{K - 1} of K={K}; grey: the same on every rank")
    plt.show()

def draw_f_and_g(K=4):
    """Megatron's MLP on K ranks, left to right: X whole, f, each rank's column slice, GeLU, its row
    slice (a partial sum), g, Y whole; above, what f and g do forward, below, backward."""
    fig, ax = plots.figure(width=11, height=3.2)
    stages = [("X", None), ("f", "op"), ("column slice k", "ranks"), ("GeLU", "ranks"),
              ("row: partial sum k", "ranks"), ("g", "op"), ("Y", None)]
    for i, (label, kind) in enumerate(stages):
        x = 1.5 * i
        if kind == "ranks":
            for k in range(K):
                ax.add_patch(Rectangle((x - 0.45, 2.2 - 0.5 * k), 0.9, 0.4, fc=plots.COLORS[k],
                                       alpha=0.7, ec="k"))
            ax.text(x, 2.85, label, ha="center", fontsize=10)
        elif kind == "op":
            ax.add_patch(Rectangle((x - 0.3, 0.7), 0.6, 1.9, fc="white", ec="k", lw=2))
            ax.text(x, 1.65, label, ha="center", va="center", fontsize=16, weight="bold")
        else:
            ax.add_patch(Rectangle((x - 0.45, 0.7), 0.9, 1.9, fc="0.85", ec="k"))
            ax.text(x, 1.65, label, ha="center", va="center", fontsize=11)
        if i:
            ax.annotate("", xy=(x - 0.5, 1.65), xytext=(x - 1.0, 1.65),
                        arrowprops=dict(arrowstyle="->", color="0.4"))
    for x, fwd, bwd in ((1.5, "forward: identity", "backward: all-reduce of dL/dX"),
                        (7.5, "forward: all-reduce", "backward: identity")):
        ax.text(x, 3.35, fwd, ha="center", fontsize=9, color=plots.MODEL)
        ax.text(x, 0.3, bwd, ha="center", fontsize=9, color=plots.MEASURED)
    ax.set(xlim=(-0.7, 9.7), ylim=(0, 3.7),
           title=f"Megatron's MLP on K = {K}: colours rank 0..{K - 1}'s slices, grey whole on every rank")
    ax.axis("off")
    plt.show()

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
    """This rank's seconds of each round: a forward + backward step as it is ("step"), with
    every dist.all_reduce a no-op ("compute": wrong values, right work), and one all-reduce of a
    tensor like x alone ("all_reduce"), the three taking turns round by round after two warm-up
    rounds (ddp_bench.time_steps: a change in the machine's load hits all three alike); and
    "wait", what a step's all-reduces waited for the last rank to launch them."""
    def step():
        blk.zero_grad(set_to_none=True)
        blk(x).sum().backward()

    def waited():
        """Seconds this rank's all-reduces of one step waited for the last rank to launch them
        (launch_stamps, perf_counter being one clock for the machine)."""
        dist.barrier()
        with launch_stamps() as stamps:
            step()
        return sum(last - mine for mine, last in stamps)

    msg = torch.randn_like(x)
    times = ddp_bench.time_steps(
        {"step": (step, contextlib.nullcontext),
         "compute": (step, ddp_bench.without_all_reduce),
         "all_reduce": (lambda: dist.all_reduce(msg), contextlib.nullcontext)}, iters)
    return {**times, "wait": [waited() for _ in range(iters)]}


@contextlib.contextmanager
def launch_stamps():
    """Inside: each dist.all_reduce first exchanges the ranks' launch clocks (a MAX all-reduce of
    one number: it returns once every rank has launched); yields [(this rank's launch, the
    last rank's)], perf_counter seconds."""
    real, stamps = dist.all_reduce, []

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        launch = time.perf_counter()
        last = torch.tensor([launch], dtype=torch.float64)
        real(last, op=dist.ReduceOp.MAX, group=group)
        stamps.append((launch, last.item()))
        return real(tensor, op=op, group=group, async_op=async_op)

    with patched(dist, all_reduce=all_reduce):
        yield stamps


def model_steps(step, scaled, steps, warmup=2):
    """In a rank: seconds of each `step()` on the scaled model (every all-reduce lecture 02's
    ring over its paced link, ddp_bench.on_model), on an unpaced link (the laptop's floor) and
    with no all-reduce at all (ddp_bench.without_all_reduce), taking turns round by round."""
    return ddp_bench.time_steps(
        {"on the model": (step, functools.partial(ddp_bench.on_model, scaled)),
         "floor": (step, functools.partial(ddp_bench.on_model, None)),
         "no communication": (step, ddp_bench.without_all_reduce)}, steps, warmup)


def slowest(per_rank, name, minus=None):
    """timing.summary (median, p10, p90, n) over rounds of the slowest rank's seconds of variant
    `name` of timed's or model_steps' results, less variant `minus`'s, round by round."""
    rounds = ddp_bench.slowest_rank(per_rank, name)
    if minus is not None:
        rounds = [a - b for a, b in zip(rounds, ddp_bench.slowest_rank(per_rank, minus))]
    return timing.summary(rounds)


def added(per_rank, name="on the model"):
    """What the paced rings added to the slowest rank's step of variant `name` of model_steps'
    results: timing.above_floor, the floor the "floor" variant's, whose model is the step
    with no communication (its least round)."""
    rounds = lambda n: ddp_bench.slowest_rank(per_rank, n)  # noqa: E731
    return timing.above_floor(rounds(name), rounds("floor"), min(rounds("no communication")))


def assert_added(added, model_s, K):
    """What the paced rings added to a step (added()) equals the model's `model_s` within
    its tolerance (the rounds' spread, the floor's and the floor beyond its model)."""
    assert abs(added["median"] - model_s) <= added["tolerance"], (
        f"K={K}: the rings added {1e3 * added['median']:.2f} ms, the model says "
        f"{1e3 * model_s:.2f} ms (tolerance {1e3 * added['tolerance']:.2f} ms)")


def span(summary, scale=1e3, digits=1):
    """A timing.summary's p10-p90 (min-max up to 5 samples) as text, e.g. "1.2 to 3.4" ms."""
    return f"{scale * summary['p10']:.{digits}f} to {scale * summary['p90']:.{digits}f}"


def growth(first, last):
    """How a time grew from timing.summary `first` to `last`: the medians' quotient, and in
    brackets its range from the two spreads (last's p10 over first's p90 to p90 over p10)."""
    return (f"x{last['median'] / first['median']:.2f} "
            f"({last['p10'] / first['p90']:.2f}-{last['p90'] / first['p10']:.2f})")
