"""Inside one rank: the timed loop (nccl-tests' method, or one call per barrier) over every case
of a plan, in shuffled rounds."""
import socket
import sys
import time

from helpers.bench.cases import _Case
from helpers.bench.common import METHODS


def _start_together(case, dev):
    """Untimed: restore the inputs, let queued GPU work finish, then a barrier (it returns on every
    rank once all have entered it; under NCCL it blocks the host too)."""
    import torch.distributed as dist

    from helpers.timing import sync

    case.reset()
    sync(dev)
    dist.barrier()
    sync(dev)


def _time_loop(case, dev, iters):
    """nccl-tests' measurement on this rank: after one barrier, `iters` calls back to back, the clock
    read once around the loop (CUDA events on the current stream on a GPU: a call without async_op
    makes that stream wait for the collective), divided by `iters`. Seconds per call."""
    import torch

    _start_together(case, dev)
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            case.run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        case.run()
    return (time.perf_counter() - t0) / iters


def measure_rank(rank, world_size, plan, sizes, warmup, iters, dtype="float32", check=True,
                 progress=False, seed=0, method="nccl-tests", rounds=1):
    """Run in every rank: for each (label, kind, fn) in plan and each size, this rank's timings.

    After `warmup` untimed runs of every case, rounds; in each round every (collective, size) of the
    plan is measured once, in an order shuffled afresh per round (the same on every rank, from
    `seed`), so a change in the machine's load, or a cache warmed by the call before, falls on every
    size and collective alike instead of on one stretch of the sweep.
    method="per-call": `iters` rounds, each measuring one call after a barrier (times: one per call).
    method="nccl-tests": `rounds` rounds, each measuring `iters` calls back to back after one
    barrier, divided by `iters` (times: one per round; nccl-tests' -N cycles, its -n calls).
    The result of each case's last run is checked (`wrong`): after the timed loop of nccl-tests'
    method (whose in-place calls compound), once more from restored inputs, as its -c 1 does.
    Returns {"host", "backend", "method", "rows": [{label, kind, size, count, times (s), wrong}]}.
    """
    import random

    import torch
    import torch.distributed as dist

    from helpers.spawn import device

    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}.")
    dev = device()
    dt = getattr(torch, dtype)
    pools = {label: {} for label, _, _ in plan}  # largest size first: the pool's buffers fit them all
    cases = {(i, n): _Case(kind, n, world_size, rank, dt, dev, fn, pools[label])
             for i, (label, kind, fn) in enumerate(plan) for n in sorted(sizes, reverse=True)}
    for case in cases.values():
        for _ in range(warmup):
            case.reset()
            case.run()
    times = {key: [] for key in cases}
    wrong = {key: -1 for key in cases}
    order, rng = list(cases), random.Random(seed)
    n_rounds, calls = (iters, 1) if method == "per-call" else (rounds, iters)   # rounds; calls timed per round
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=n_rounds, desc="bench", unit="round", file=sys.stderr)
    for r in range(n_rounds):
        rng.shuffle(order)
        for key in order:
            times[key].append(_time_loop(cases[key], dev, calls))
            if check and r == n_rounds - 1:  # checked at once: the next case may share its buffers
                if method != "per-call":
                    cases[key].reset()
                    cases[key].run()
                wrong[key] = cases[key].wrong()
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    rows = [{"label": label, "kind": kind, "size": cases[(i, n)].nbytes, "count": cases[(i, n)].count,
             "times": times[(i, n)], "wrong": wrong[(i, n)]}
            for i, (label, kind, _) in enumerate(plan) for n in sizes]
    return {"host": socket.gethostname(), "backend": dist.get_backend(), "method": method,
            "iters": iters, "rows": rows}
