"""Reference solutions for the exercises of lecture 04 (CUDA streams and overlap)."""
import torch
import torch.distributed as dist


def ideal_overlap_time(t_a, t_b):
    """Time of two independent pieces of work (t_a, t_b seconds) on two engines."""
    return max(t_a, t_b)


def hidden_fraction(t_sequential, t_overlapped, t_comm, t_compute):
    """Share of min(t_comm, t_compute) that overlapping saved (1 = ideal, 0 = nothing)."""
    return (t_sequential - t_overlapped) / min(t_comm, t_compute)


def pipelined_time(t_copy, t_compute, chunks):
    """Total time of a copy -> compute pipeline split into `chunks` equal pieces on two streams.

    The first copy piece and the last compute piece cannot overlap anything; in between, the
    slower of the two streams sets the pace for the other chunks - 1 pieces.
    """
    return (t_copy + t_compute + (chunks - 1) * max(t_copy, t_compute)) / chunks


def overlapped_all_reduce(rank, world_size):
    """Return (the all-reduced tensor, the tensor computed while it ran)."""
    x = torch.full((4,), rank + 1.0)
    work = dist.all_reduce(x, async_op=True)
    computed = torch.arange(4.0) * (rank + 1)
    work.wait()
    return x, computed
