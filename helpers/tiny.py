"""The one tiny model lectures 05-08 share: a stack of residual MLP blocks, seeded identically.

    model = tiny.model(dim=32, hidden=128, depth=4, seed=0)          # nn.Sequential of Blocks
    x, y = tiny.batch(64, dim=32, seed=1)                            # inputs and regression targets
    loss = tiny.loss(model(x), y)

Every rank that calls `model(...)` with the same arguments gets bit-identical parameters, so data,
tensor and pipeline parallel versions can be checked against a single-process run. float64 by
default, so checks can use tight tolerances.
"""
import torch
from torch import nn


class Block(nn.Module):
    """x + fc2(gelu(fc1(x))): the MLP of a transformer layer, with its residual connection."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def model(dim=32, hidden=128, depth=4, seed=0, dtype=torch.float64, device="cpu"):
    """A Sequential of `depth` Blocks with deterministic parameters (seeded generator, no global RNG)."""
    g = torch.Generator().manual_seed(seed)
    m = nn.Sequential(*[Block(dim, hidden) for _ in range(depth)]).to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else p.shape[0]
            p.copy_((torch.rand(p.shape, generator=g, dtype=dtype) * 2 - 1) / fan_in ** 0.5)
    return m.to(device)


def batch(n, dim=32, seed=1, dtype=torch.float64, device="cpu"):
    """n inputs and targets (a fixed smooth function of the inputs), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=dtype)
    y = torch.sin(x) + 0.1 * x.roll(1, dims=1)
    return x.to(device), y.to(device)


def loss(out, target):
    """Mean squared error, averaged over the batch (so shards average to the full-batch loss)."""
    return ((out - target) ** 2).mean()
