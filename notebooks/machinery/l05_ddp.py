"""Measuring machinery of the DDP lecture: the H100 model's all-reduce, interleaved step timing,
a traced step (lectures 07 and 09 use the first two).

    with ddp_bench.on_model(h100, share) as stream:          # inside a rank (gloo)
        step()                                               # the plain DDP code, unchanged
    stream.calls   # [{"nbytes", "queued", "start", "end"}], perf_counter seconds

    with ddp_bench.without_all_reduce():                     # the same code, nothing exchanged
        step()                                               # (what DDP's copies and hooks cost)

    times = ddp_bench.time_steps({"bucketed": (step, on_model), ...}, steps, warmup)

`on_model(scaled, share)` runs every `dist.all_reduce` as lecture 02's ring over the scaled
model's paced link on a comm stream of the rank's own (helpers.comm_stream), compute beside it
slowed by `share` (standins.contention): its time comes from the ring's steps, not a formula.
A gloo-only stand-in: the paced link sleeps on the host.
"""
import contextlib
import time

import torch
import torch.distributed as dist

from helpers import comm_stream, standins, timing
from helpers.patching import patched


class _Done:
    """The work of an all-reduce that did not run."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True

    def get_future(self):
        future = torch.futures.Future()
        future.set_result(None)
        return future


@contextlib.contextmanager
def on_model(scaled, share=0.0, algorithm=None, all_gather=None):
    """Inside (a rank, gloo): every dist.all_reduce is lecture 02's ring (or `algorithm(x)`, in
    place), and given `all_gather(output, input)` every dist.all_gather_single is that, over the
    paced link of `scaled` (a helpers.machines.Scaled; None: an unpaced link, the laptop's
    floor), run on this rank's comm stream (helpers.comm_stream: async_op returns at once, the
    calls run one at a time), and device-like compute that runs while one is in flight is
    `share` slower (standins.contention). Yields the stream: its `calls` log each collective's
    bytes and its queued, start and end times (perf_counter)."""
    from course.ring_math import ring_all_reduce

    link = scaled.link() if scaled is not None else (None,)
    with comm_stream.paced(algorithm or ring_all_reduce, *link, all_gather=all_gather) as stream, \
            standins.contention(share):
        yield stream


@contextlib.contextmanager
def without_all_reduce():
    """Inside: dist.all_reduce does nothing (the tensor keeps its value) and returns a done work."""
    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        return _Done() if async_op else None

    with patched(dist, all_reduce=all_reduce):
        yield


def time_steps(variants, steps, warmup=2, device=None):
    """{name: [seconds of each timed step]} of every variant {name: (step, context)}: `step()` runs
    inside `context()` (a fresh context manager per step), after a barrier, on helpers.timing's
    clock. The variants take turns step by step, so a change in the machine's load hits all alike."""
    times = {name: [] for name in variants}
    for i in range(warmup + steps):
        for name, (step, context) in variants.items():
            dist.barrier()
            clock = timing.Clock(device)
            with context():
                clock.now("start")
                step()
                clock.now("end")
            if i >= warmup:
                times[name].append(clock.read()["end"])
    return times


def slowest_rank(per_rank, name):
    """Per step, the slowest rank's time: a DDP step is as slow as its slowest rank."""
    return [max(ts) for ts in zip(*(r[name] for r in per_rank))]


def bucket_plan(ddp):
    """(index of the earliest block, bytes) of each bucket of a bucketed DDP whose module is
    a Sequential of blocks, in launch order: the block whose backward makes it ready."""
    block = {id(p): j for j, b in enumerate(ddp.module) for p in b.parameters()}
    return [(min(block[id(p)] for p in b), sum(p.numel() * p.element_size() for p in b))
            for b in ddp.buckets]


def torch_buckets(rank, world_size, configs, iterations=3, seed=0):
    """What torch's DistributedDataParallel hands its communication hook, per iteration: for
    each {label: (tiny.model kwargs, DDP kwargs)}, [(iteration, bucket index, parameter names,
    bytes)]. A rank's function for helpers.spawn."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    from helpers import tiny
    from helpers.spawn import device

    dev, out = device(), {}
    for label, (model_kw, ddp_kw) in configs.items():
        model = tiny.model(**model_kw, seed=seed, device=dev)
        x, y = tiny.batch(16, model_kw["dim"], seed=1 + rank, device=dev)
        names = {id(p): n for n, p in model.named_parameters()}
        ddp, state = DistributedDataParallel(model, **ddp_kw), {"iteration": 0, "log": []}

        def hook(state, bucket):
            ps = bucket.parameters()
            state["log"].append((state["iteration"], bucket.index(), [names[id(p)] for p in ps],
                                 sum(p.numel() * p.element_size() for p in ps)))
            return default_hooks.allreduce_hook(None, bucket)

        ddp.register_comm_hook(state, hook)
        # find_unused_parameters warns that none were unused; on gloo only is stderr silenced,
        # since under NCCL it also carries the watchdog's errors
        quiet = ddp_kw.get("find_unused_parameters") and dist.get_backend() == "gloo"
        with quiet_stderr() if quiet else contextlib.nullcontext():
            for state["iteration"] in range(iterations):
                model.zero_grad()
                tiny.loss(ddp(x), y).backward()
        out[label] = state["log"]
    return out


@contextlib.contextmanager
def quiet_stderr():
    """Inside: what C++ writes to this process's stderr (its logging) goes nowhere."""
    import os
    import sys

    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def traced_step(rank, world_size, make_ddp, batch, scaled, share, steps=2):
    """The last of `steps` DDP steps on a scaled model (on_model), recorded: a rank's function
    for helpers.spawn. make_ddp(dev) builds the DDP, batch(rank, dev) gives (x, y). Returns the
    spans of forward, backward and the wait (timeline.Recorder), each bucket's time on the link,
    and when each was queued, in seconds from one origin."""
    from helpers import tiny, timeline
    from helpers.spawn import device

    dev = device()
    ddp, (x, y) = make_ddp(dev), batch(rank, dev)
    for _ in range(steps):
        dist.barrier()
        origin, rec = time.perf_counter(), timeline.Recorder(dev)
        with on_model(scaled, share) as link:
            ddp.module.zero_grad()
            with rec.span("forward"):
                loss = tiny.loss(ddp(x), y)
            with rec.span("backward"):
                loss.backward()
            with rec.span("wait for the buckets"):
                ddp.finish_gradient_sync()
    on_link = [{"name": "bucket on the link", "start": c["start"] - origin,
                "end": c["end"] - origin} for c in link.calls]
    return rec.events(origin=origin), on_link, [c["queued"] - origin for c in link.calls]
