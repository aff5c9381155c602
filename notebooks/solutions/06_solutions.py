"""Reference solutions of lecture 06's exercises (ZeRO). Try the exercises first."""
import math
from fractions import Fraction

import torch
import torch.distributed as dist


def max_params(memory_bytes, n, stage):
    """Largest whole number of parameters whose mixed-precision Adam states (2+2+12 bytes) fit per rank."""
    p, g, k = 2, 2, 12
    per_param = (Fraction(p, n if stage >= 3 else 1) + Fraction(g, n if stage >= 2 else 1)
                 + Fraction(k, n if stage >= 1 else 1))
    return math.floor(Fraction(int(memory_bytes)) / per_param)


def shard_bounds(numel, n, rank):
    """(padded length, lo, hi): pad to a multiple of n; rank owns [lo, hi)."""
    padded = -(-numel // n) * n
    size = padded // n
    return padded, rank * size, (rank + 1) * size


def ring_bytes_sent(stage, numel, n, elem_bytes):
    """Per-rank bytes sent per step: DDP and ZeRO-1/2 two (n-1)/n passes over the data, ZeRO-3 three."""
    passes = 3 if stage == 3 else 2
    return passes * (n - 1) / n * numel * elem_bytes


def sharded_mean_grad(flat_grad, rank, world_size):
    """This rank's slice of the gradient averaged over ranks: one reduce-scatter, then divide."""
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    out = flat_grad.new_empty(flat_grad.numel() // world_size)
    reduce_scatter(out, flat_grad)
    return out / world_size
