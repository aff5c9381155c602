"""Reference solutions for the exercises of lecture 01 (notebooks/01_collectives.ipynb).

Each function runs on every rank, inside a launch, with the default process group ready.
"""
import torch
import torch.distributed as dist


def my_all_reduce(x):
    """Sum x over all ranks, in place, with reduce + broadcast."""
    dist.reduce(x, dst=0)  # the sum lands on rank 0; the other ranks' x is now undefined ...
    dist.broadcast(x, src=0)  # ... and is overwritten with rank 0's sum here
    return x


def my_all_gather(x):
    """Every rank's x, in rank order, with point-to-point calls only."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    out = [x.clone() if j == rank else torch.empty_like(x) for j in range(world_size)]
    ops = []
    for j in range(world_size):
        if j != rank:
            ops.append(dist.P2POp(dist.isend, x, j))
            ops.append(dist.P2POp(dist.irecv, out[j], j))
    for request in dist.batch_isend_irecv(ops):  # all started together: no order to get wrong
        request.wait()
    return out


def ring_shift(x, k):
    """The tensor of rank (rank - k) % world_size."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    got = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, (rank + k) % world_size),
           dist.P2POp(dist.irecv, got, (rank - k) % world_size)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return got


def global_argmax(x):
    """(largest value over all ranks, lowest rank holding it), the same on every rank."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    best = x.max().reshape(1)
    dist.all_reduce(best, op=dist.ReduceOp.MAX)
    holder = torch.tensor([rank if (x == best).any() else world_size], device=x.device)
    dist.all_reduce(holder, op=dist.ReduceOp.MIN)
    return best.item(), int(holder.item())
