"""Measuring machinery of the pipeline lecture (08): timed steps on device-like stages.

    runs = spawn(pp_bench.timed_steps, p, args=(schedule, ms, work_ms, dim, hidden, depth, micro))
    ev = pp_bench.events_of(runs, m)        # [(stage, kind, i, start, end)] of step m, seconds
    hop = pp_bench.hop_of(runs)             # one-way latency of an activation, ping-pong, seconds
    runs = spawn(pp_bench.rounds, p, args=(plans, m, n, dim, hidden, depth, micro))
    ev = pp_bench.events_of(runs, (name, r))   # plan `name`'s round r, plans run in turn
    times = spawn(pp_bench.torch_step_times, p, args=(names, m, block_ms, dim, hidden))[0]
                                            # torch.distributed.pipelining's steps, seconds

It wraps the lecture's plain engine (course.pipeline_parallel.run_schedule) from outside: each
action's extra work is `standins.device_compute` (work_ms a forward and twice that a backward,
or {kind: ms} for every kind of action: "F", "B", "W"), which takes its time without a core (a host
sleep on the CPU, a kernel spinning on the stream on a GPU), so p stages overlap even on 2 cores.
The hop latency is measured apart, before and after the steps: rank 0 and rank 1 bounce an
activation-sized tensor through `batch_isend_irecv` (the engine's path); the hop is half the
fastest of the 40 round trips, as load and wake-ups only add to a trip (a median of 20 moved
tenfold between two identical runs).
"""
import time

import torch
import torch.distributed as dist

from helpers import standins, tiny
from helpers.spawn import device


def _hop(rank, shape, dev, rounds=20):
    """One-way latency between ranks 0 and 1 (other ranks: None), seconds."""
    t = torch.zeros(shape, device=dev, dtype=torch.float64)
    trips = []
    for _ in range(rounds + 2):                   # the first two are a warm-up
        if rank == 0:
            t0 = time.perf_counter()
            dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 1)])[-1].wait()
            dist.batch_isend_irecv([dist.P2POp(dist.irecv, t, 1)])[-1].wait()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            trips.append(time.perf_counter() - t0)
        elif rank == 1:
            dist.batch_isend_irecv([dist.P2POp(dist.irecv, t, 0)])[-1].wait()
            dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 0)])[-1].wait()
    dist.barrier()
    return min(trips[2:]) / 2 if rank == 0 else None


def _setup(rank, p, work_ms, dim, hidden, depth):
    """This rank's stage and its work(kind): work_ms (a forward; a backward twice) or
    {kind: ms}."""
    from course.pipeline_parallel import stage_module
    dev = device()
    stage = stage_module(tiny.model(dim, hidden, depth, seed=0), rank, p).to(dev)
    ms = work_ms if isinstance(work_ms, dict) else {"F": work_ms, "B": 2 * work_ms}

    def work(kind):
        standins.device_compute(ms[kind] / 1e3, dev)
    return stage, work, dev


def _step(stage, schedule, m, work, rank, p, dim, micro, dev):
    """(timeline, peak micro-batches, peak bytes) of one step of m micro-batches."""
    from course.pipeline_parallel import run_schedule
    x, y = tiny.batch(m * micro, dim, seed=1, device=dev)
    dist.barrier()
    timeline, peak, peak_bytes, _ = run_schedule(
        stage, schedule(p, m, rank), x.chunk(m), y.chunk(m), rank, p, work)
    stage.zero_grad()
    return timeline, peak, peak_bytes


def timed_steps(rank, p, schedule, ms, work_ms, dim, hidden, depth, micro):
    """{m: (timeline, peak micro-batches, peak bytes)} for each m in ms, and {"hop": seconds}
    (rank 0's; None elsewhere)."""
    stage, work, dev = _setup(rank, p, work_ms, dim, hidden, depth)
    hops = [_hop(rank, (micro, dim), dev)]
    out = {}
    for m in [ms[0]] + list(ms):                   # the first run is a warm-up
        out[m] = _step(stage, schedule, m, work, rank, p, dim, micro, dev)
    hops.append(_hop(rank, (micro, dim), dev))     # before and after: the fastest
    out["hop"] = min(hops) if rank == 0 else None
    return out


def rounds(rank, p, plans, m, n, dim, hidden, depth, micro):
    """{(name, r): (timeline, peak micro-batches, peak bytes)} of n rounds in which every plan
    {name: (schedule, work_ms)} runs one step of m micro-batches in turn (so load falls on all
    alike), after a warm-up round; and {"hop": seconds} as timed_steps."""
    runs = {name: _setup(rank, p, work_ms, dim, hidden, depth) + (schedule,)
            for name, (schedule, work_ms) in plans.items()}
    dev = next(iter(runs.values()))[2]
    hops, out = [_hop(rank, (micro, dim), dev)], {}
    for r in [0] + list(range(n)):                 # the first round is a warm-up
        for name, (stage, work, _, schedule) in runs.items():
            out[name, r] = _step(stage, schedule, m, work, rank, p, dim, micro, dev)
    hops.append(_hop(rank, (micro, dim), dev))
    out["hop"] = min(hops) if rank == 0 else None
    return out


def events_of(per_rank, m):
    """All ranks' timelines of step m (or rounds' key (name, r)) as [(stage, kind, i, start, end)]."""
    return [(s, kind, i, t0, t1) for s, res in enumerate(per_rank)
            for kind, i, t0, t1 in res[m][0]]


def hop_of(per_rank):
    """The hop latency rank 0 measured, seconds."""
    return per_rank[0]["hop"]


def torch_step_times(rank, p, names, m, block_ms, dim, hidden, steps=3):
    """{schedule name: [seconds of each step]} of torch.distributed.pipelining's schedules on
    a model of 2p device-like blocks (standins.DeviceLike, block_ms forward, twice that
    backward): one stage of two blocks per rank, or two chunks of one block when the name
    says "Interleaved". A first step warms up."""
    from torch.distributed import pipelining
    from course.pipeline_parallel import stage_module
    dev = device()
    x, y = tiny.batch(4 * m, dim, seed=1, device=dev)
    out = {}
    for name in names:
        model = torch.nn.Sequential(*[standins.DeviceLike(b, block_ms / 1e3)
                                      for b in tiny.model(dim, hidden, 2 * p, seed=0)]).to(dev)
        n, ks = (2 * p, [rank, p + rank]) if "Interleaved" in name else (p, [rank])
        stages = [pipelining.PipelineStage(stage_module(model, k, n), k, n, dev) for k in ks]
        schedule = getattr(pipelining, name)(stages if len(ks) > 1 else stages[0],
                                             n_microbatches=m, loss_fn=tiny.loss)
        times = []
        for _ in range(steps + 1):
            dist.barrier()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            if rank == 0:
                schedule.step(x)
            elif rank == p - 1:
                schedule.step(target=y, losses=[])
            else:
                schedule.step()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            dist.barrier()
            times.append(time.perf_counter() - t0)
        out[name] = times[1:]
    return out
