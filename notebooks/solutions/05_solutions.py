"""Reference solutions for the exercises of lecture 05 (distributed data parallel)."""
import torch.distributed as dist


def assign_buckets(sizes, cap, first_cap):
    """Buckets of parameter indices, the last parameter first."""
    buckets, current, size = [], [], 0
    for i in reversed(range(len(sizes))):
        current.append(i)
        size += sizes[i]
        if size >= (first_cap if not buckets else cap):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def average_gradients(model, world_size):
    """Make every p.grad of `model` the mean of that gradient over all ranks."""
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world_size


def bytes_sent_per_step(param_bytes, world_size, micro_batches):
    """Bytes one rank sends per optimizer step (ring all-reduce)."""
    return 2 * (world_size - 1) / world_size * param_bytes
