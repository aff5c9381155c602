"""Lecture 09's pieces that later lectures reuse, exactly as notebooks/09_profiling_debugging.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
from helpers import tiny
from torch.profiler import record_function


RANGES = ("forward", "backward", "wait for gradients", "optimizer")


def train_step(net, opt, x, y, sync=lambda: None):
    """One data-parallel step, its phases named for the profiler."""
    with record_function("forward"):
        loss = tiny.loss(net(x), y)
    with record_function("backward"):
        loss.backward()         # DDP launches its all-reduces from hooks in here
    with record_function("wait for gradients"):
        sync()
    with record_function("optimizer"):
        opt.step()
        opt.zero_grad()
