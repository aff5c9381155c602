"""Lecture 11's measuring machinery. Sequence parallelism's memory: the bytes autograd keeps for the
backward of a piece of code, counted by wrapping it (saved_tensors_hooks), never by a counter inside it
(saved_bytes). Context parallelism: what a rank's ring attention costs, counted by wrapping the plain
code (FlopCounterMode for the matmuls, helpers.trace for the bytes sent), the key claim's assertion
(counted work per rank equals the causal layout's model), and the key figure. It holds none of the
lecture's algorithm.
"""
import contextlib

import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers import plots, trace


def saved_bytes(run, params=()):
    """Bytes autograd saves for backward while `run()` executes: each storage once (q, k and v
    are views of one qkv output), the parameters in `params` left out (they are not activations)."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    kept = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()              # kept alive until counted: no saved storage is freed and reused
    total = sum(kept.values())
    del out
    return total


@contextlib.contextmanager
def counted():
    """`with counted() as c:` around a rank's code; on exit c holds its matmul flops
    (FlopCounterMode) and the bytes its point-to-point sends carried (helpers.trace)."""
    out = {}
    with trace.calls() as log, FlopCounterMode(display=False) as flops:
        yield out
    out.update(flops=flops.get_total_flops(), sent=log.nbytes("send"), sends=log.count("send"))


def assert_work(counted_flops, pairs, flops_per_pair, layout):
    """The key claim: every rank's counted matmul flops equal the model, its chunk pairs times
    the flops of one pair (both are counts: tolerance 0). counted_flops and pairs: per rank."""
    model = [p * flops_per_pair for p in pairs]
    assert list(counted_flops) == model, (
        f"{layout}: counted {list(counted_flops)} flops per rank, the model says {model}")


def imbalance(per_rank):
    """The slowest rank's share over the mean: what the ring's step time pays for imbalance."""
    return max(per_rank) / (sum(per_rank) / len(per_rank))


def draw_work(ax, counted_by_layout, model_by_layout, unit):
    """Bars: counted flops per rank of each layout (in `unit` flops); black ticks: the model."""
    layouts = list(counted_by_layout)
    K = len(counted_by_layout[layouts[0]])
    width = 0.8 / len(layouts)
    for n, name in enumerate(layouts):
        xs = [r + (n - (len(layouts) - 1) / 2) * width for r in range(K)]
        ax.bar(xs, [f / unit for f in counted_by_layout[name]], width, color=plots.COLORS[n],
               label=f"{name}: counted")
        ax.plot(xs, [f / unit for f in model_by_layout[name]], "k_", ms=18, mew=2)
    ax.plot([], [], "k_", ms=12, mew=2, label="model: pairs x flops per pair")
    ax.set_xticks(range(K), [f"rank {r}" for r in range(K)])
    ax.legend(fontsize=8)
