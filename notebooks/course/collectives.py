"""Lecture 01's pieces that later lectures reuse, exactly as notebooks/01_collectives.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import time
import torch.distributed as dist
from helpers import timeline


def barrier_timeline(rank, world_size, t0, barrier=dist.barrier):
    """Rank r works r/2 s, then calls `barrier`: two spans, in seconds since t0."""
    rec = timeline.Recorder()
    with rec.span("work"):
        time.sleep(rank / 2)  # uneven work: rank r arrives r/2 s after rank 0
    with rec.span("barrier"):
        barrier()
    return rec.events(origin=t0)

def assert_barrier_held(by_rank):
    """No rank left the barrier before the last arrived; (last arrival, first exit)."""
    spans = [e for events in by_rank for e in events if e["name"] == "barrier"]
    arrived, left = max(e["start"] for e in spans), min(e["end"] for e in spans)
    assert left >= arrived, f"a rank left at {left:.3f}, the last came at {arrived:.3f}"
    return arrived, left
