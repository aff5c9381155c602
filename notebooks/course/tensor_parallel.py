"""Lecture 07's pieces that later lectures reuse, exactly as notebooks/07_tensor_parallel.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class CopyToTP(torch.autograd.Function):
    """f: identity forward; all-reduce (sum) of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad)
        return grad

class ReduceFromTP(torch.autograd.Function):
    """g: all-reduce (sum) forward; identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous().clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad

f, g = CopyToTP.apply, ReduceFromTP.apply

class ColumnParallelLinear(nn.Module):
    """This rank's output features of `full`: rows `rows` of its weight (default: the
    k-th of K equal slices). Input: the same on every rank. Output: its feature slice"""

    def __init__(self, full, rank, K, rows=None):
        super().__init__()
        n = full.out_features // K
        rows = torch.arange(rank * n, (rank + 1) * n) if rows is None else rows
        self.weight = nn.Parameter(full.weight.detach()[rows].clone())
        self.bias = nn.Parameter(full.bias.detach()[rows].clone())

    def forward(self, x):
        return F.linear(f(x), self.weight, self.bias)

class RowParallelLinear(nn.Module):
    """This rank's input features of `full` (a column slice of its weight), all the bias
    Input: this rank's slice of the features. Output: the full result, on every rank."""

    def __init__(self, full, rank, K):
        super().__init__()
        n = full.in_features // K
        cols = slice(rank * n, (rank + 1) * n)
        self.weight = nn.Parameter(full.weight.detach()[:, cols].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x_slice):
        return g(F.linear(x_slice, self.weight)) + self.bias   # bias once, after g

class ParallelBlock(nn.Module):
    """tiny.Block on K ranks: x + fc2(gelu(fc1(x))), fc1 by columns, fc2 by rows."""

    def __init__(self, block, rank, K):
        super().__init__()
        self.fc1 = ColumnParallelLinear(block.fc1, rank, K)
        self.fc2 = RowParallelLinear(block.fc2, rank, K)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))

def megatron_traffic(blocks, tokens, dim, itemsize):
    """Megatron blocks (column then row): per block one all-reduce of tokens x dim
    values forward (g) and one backward (f); {(phase, kind): (calls, bytes)}."""
    nbytes = blocks * tokens * dim * itemsize
    return {("forward", "all_reduce"): (blocks, nbytes),
            ("backward", "all_reduce"): (blocks, nbytes)}

def assert_traffic(rows, model):
    """The tracer's rows (phase, kind, calls, bytes) equal the model: both count."""
    got = {(r["phase"], r["kind"]): (r["calls"], r["bytes"]) for r in rows}
    assert got == model, f"counted {got}, the model says {model}"
