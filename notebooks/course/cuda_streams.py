"""Lecture 04's pieces that later lectures reuse, exactly as notebooks/04_cuda_streams.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import torch.distributed as dist


def sequential_step(x, compute):
    """All-reduce x (sum), then compute: nothing overlaps."""
    dist.all_reduce(x)
    return compute()


def overlapped_step(x, compute):
    """Start the all-reduce, compute while it runs, wait before x is used."""
    work = dist.all_reduce(x, async_op=True)
    out = compute()                                # must not read or write x
    work.wait()                                    # the synchronisation point
    return out

def assert_overlaps(rows, atol_ms=5.0):
    """Each row's overlapped step takes its "overlapped model ms" within atol_ms: the
    model's max(comm, compute + comm c/(1+c)), from the machine's figures alone."""
    for row in rows:
        off = row["overlapped ms"] - row["overlapped model ms"]
        assert abs(off) <= atol_ms, (
            f"{row}: overlapped {row['overlapped ms']:.1f} ms, {off:+.1f} ms off the "
            f"model's {row['overlapped model ms']:.1f} ms")
    return True

def assert_hides_the_shorter(rows, atol=0.1):
    """Cores to spare: each row's overlap is min(1, measured ratio) within atol."""
    for row in rows:
        want = min(1.0, row["measured ratio"])
        assert abs(row["overlap"] - want) <= atol, (row["ratio"], row["overlap"], want)
