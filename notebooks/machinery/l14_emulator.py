"""Lecture 14's emulated H100 node: lecture 13's program (notebooks/nd3d.py), unchanged, run with
the H100 model's compute and links on a virtual clock, so that the planner's prediction can be
checked against a run it did not produce.

    runs = spawn(l14_emulator.run_rank, 8, args=(cfg, layouts, steps, SCALE), backend="gloo")
    l14_emulator.step_seconds(runs, (2, 2, 2, 4, None))   # dp, tp, pp, m, stages: model seconds

The tiny GPT stands for the same GPT with every dimension S times larger (width, sequence,
vocabulary, positions; the batch, the depth and the heads as they are), in bf16. Each rank keeps
the model's time on its own clock, which only these advance:
- **compute**: each stage's forward takes the H100's time (its achieved GEMM rate) for S^3 times
  the FLOPs torch counts in that forward here (torch.utils.flop_counter: every matmul of a model
  whose dimensions are S times larger does S^3 times the work), its backward twice that (a
  matmul's input and weight gradients are each as much work as its forward);
- **messages**: every all-reduce is lecture 02's ring (course.ring_math) on its group, and every
  message, the ring's and the pipeline's, takes one NVLink step of the model (machines.link:
  alpha + bytes / B, each byte here S^2 / 4 of the model's: float64 here, bf16 there): the sender
  is busy that long (its clock moves on), the message carries the time it is through, and the
  receiver's clock moves to it if it is later (and its in-port takes messages one after another);
- a barrier sets its group's clocks to the latest of them.
So a step's time is what the program's own order of work and messages makes of the model's
times: the schedule's waits, the ring's 2(K-1) steps, the sends on the critical path. The laptop's
own speed (a gloo message between 8 ranks on 2 cores takes about a millisecond) does not enter.
The emulator knows the machine model and runs the real program; it contains no planner code.
"""
import contextlib
import functools
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.utils.flop_counter import FlopCounterMode

from helpers import machines, timing
from helpers.patching import patched

CLOCK = {"now": 0.0, "in_free": 0.0}   # this rank's model time, and when its in-port is free


class VirtualClock:
    """helpers.timing.Clock's interface, reading this rank's model time (CLOCK)."""

    def __init__(self, device=None):
        self.stamps = {}

    def now(self, key):
        self.stamps[key] = CLOCK["now"]

    def read(self):
        return dict(self.stamps)


class ModelTime(torch.autograd.Function):
    """The identity that advances the clock by forward_s in forward and backward_s in backward."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        ctx.backward_s = backward_s
        CLOCK["now"] += forward_s
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        CLOCK["now"] += ctx.backward_s
        return grad, None, None


class _Received:
    """A receive's work: waiting for it copies the payload out and moves the clock to its time."""

    def __init__(self, work, tensor, buf, seconds):
        self._work, self._tensor, self._buf, self._seconds = work, tensor, buf, seconds

    def wait(self, *args, **kwargs):
        out = self._work.wait(*args, **kwargs)
        self._tensor.copy_(self._buf[:-1].view_as(self._tensor))
        through = max(float(self._buf[-1]), CLOCK["in_free"] + self._seconds)
        CLOCK["in_free"] = through
        CLOCK["now"] = max(CLOCK["now"], through)
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


class _Sent:
    """A send's work, holding the stamped copy until it is through."""

    def __init__(self, work, stamped):
        self._work, self._stamped = work, stamped

    def __getattr__(self, name):
        return getattr(self._work, name)


def virtual_link(alpha, bw, bytes_scale):
    """{"isend", "irecv", "barrier"} on the model's clock: a message of n bytes here takes
    alpha + n * bytes_scale / bw of the model (see the module's docstring). float64 tensors only."""
    real_isend, real_irecv, real_barrier, real_all_reduce = (
        c10d.isend, c10d.irecv, c10d.barrier, c10d.all_reduce)

    def seconds(tensor):
        if tensor.dtype != torch.float64:
            raise TypeError(f"the virtual link stamps float64 messages, got {tensor.dtype}")
        return alpha + tensor.numel() * tensor.element_size() * bytes_scale / bw

    def isend(tensor, *args, **kwargs):
        CLOCK["now"] += seconds(tensor)             # the sender is busy until it is through
        stamped = torch.cat([tensor.reshape(-1), torch.tensor([CLOCK["now"]], dtype=tensor.dtype)])
        return _Sent(real_isend(stamped, *args, **kwargs), stamped)

    def irecv(tensor, *args, **kwargs):
        buf = torch.empty(tensor.numel() + 1, dtype=tensor.dtype)
        return _Received(real_irecv(buf, *args, **kwargs), tensor, buf, seconds(tensor))

    def barrier(group=None, *args, **kwargs):
        latest = torch.tensor([CLOCK["now"]], dtype=torch.float64)
        real_all_reduce(latest, op=dist.ReduceOp.MAX, group=group)
        CLOCK["now"] = float(latest)

    return {"isend": isend, "irecv": irecv, "barrier": barrier}


@contextlib.contextmanager
def as_world(group):
    """Inside: dist.get_rank and dist.get_world_size answer for `group`, and a dist.P2POp's peer is
    a rank of the group, so that lecture 02's ring, written for the whole world, runs on it."""
    ranks, me, real = dist.get_process_group_ranks(group), dist.get_rank(), dist.P2POp

    def p2p(op, tensor, peer=None, *args, **kwargs):
        return real(op, tensor, group=group, group_peer=peer)

    with patched(dist, get_rank=lambda group=None: ranks.index(me),
                 get_world_size=lambda group=None: len(ranks), P2POp=p2p):
        yield


def ring_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    """dist.all_reduce as lecture 02's ring on `group` (a sum, blocking)."""
    from course.ring_math import ring_all_reduce as ring
    if op != dist.ReduceOp.SUM or async_op:
        raise ValueError("the emulator's all_reduce is a blocking sum")
    with as_world(group or dist.group.WORLD):
        ring(tensor)


def timed_stages(real, machine, scale, counted):
    """nd3d.stage_forward followed by the model's time for its work (the module's docstring);
    `counted` keeps the forward FLOPs counted per stage and input shape."""
    @functools.wraps(real)
    def stage_forward(P, x, cfg, comm):
        key = (min(P), tuple(x.shape))
        if key not in counted:
            with FlopCounterMode(display=False) as flops:
                out = real(P, x, cfg, comm)
            counted[key] = flops.get_total_flops()
        else:
            out = real(P, x, cfg, comm)
        forward_s = counted[key] * scale ** 3 / machine.gemm_flops
        return ModelTime.apply(out, forward_s, 2 * forward_s)
    return stage_forward


@contextlib.contextmanager
def on_model(scale, machine=machines.H100):
    """Inside (a rank of nd3d, gloo): nd3d runs on `machine`'s model on the virtual clock, its
    tiny GPT standing for one `scale` times larger. Yields the FLOPs counted ({key: FLOPs})."""
    import nd3d
    alpha, bw = machines.link(machine)
    link, counted = virtual_link(alpha, bw, scale * scale * 2 / 8), {}
    CLOCK.update(now=0.0, in_free=0.0)
    with patched(c10d, **link), patched(dist, **link, all_reduce=ring_all_reduce), \
            patched(timing, Clock=VirtualClock), \
            patched(nd3d, stage_forward=timed_stages(nd3d.stage_forward, machine, scale, counted)):
        yield counted


def run_rank(rank, world_size, cfg, layouts, steps, scale):
    """In every rank (helpers.spawn, gloo): nd3d.train of each (dp, tp, pp, m, stages) of `layouts`
    on the model (on_model); stages: blocks per pipeline stage, None for depth / pp each. Returns
    {layout: nd3d.train's result, with "flops" (on_model's count) and "here_s" (the seconds the
    run took on this machine, per step)}."""
    import nd3d
    out = {}
    for dp, tp, pp, m, stages in layouts:
        start = time.perf_counter()
        with on_model(scale) as counted:
            run = nd3d.train(rank, world_size, dp, tp, pp, dict(cfg, stages=stages), steps, m,
                             timed=True)
        run.update(flops=dict(counted), here_s=(time.perf_counter() - start) / steps)
        out[dp, tp, pp, m, stages] = run
    return out


def step_seconds(per_rank, layout):
    """The slowest rank's mean step (the model's seconds), the steps back to back. No warm-up to
    leave out: nothing the clock counts is faster the second time (no caches, no connections)."""
    return max(statistics.fmean(r[layout]["step_s"]) for r in per_rank)


def here_seconds(per_rank, layout):
    """The seconds a step of `layout` took on this machine (the slowest rank's)."""
    return max(r[layout]["here_s"] for r in per_rank)
