"""Measuring machinery of the profiling lecture (09): a profiled, device-like DDP run and the
per-iteration breakdown read off its Chrome traces.

    runs = spawn(profile_bench.profiled_steps, k, backend="gloo",
                 args=(train_step, model_kw, cap_mb, layer_s, gbps, alpha_s, steps, folder))
    steps = profile_bench.steps_of(runs)          # per step, per rank: {range: (start, end)} s
    measured = profile_bench.exposed(steps, runs[0]["link"])  # last launch to the wait's end, s
    model = profile_bench.modelled_exposed(runs[0]["plan"], depth, layer_s, gbps, alpha_s, k)
    profile_bench.assert_exposed_predicted(measured, model, tolerance_s)

`profiled_steps` wraps the lecture's plain step from outside: lecture 05's BucketedDDP over the
tiny model whose blocks are `standins.DeviceLike` (backward 2 layer_s per block without a core), its
all-reduces paced by `ddp_bench.paced_all_reduce` (alpha + 2(K-1)/K n/B on a link that needs no
core), under `torch.profiler.profile` with a schedule (2 warm-up steps) and a trace handler that
writes each rank's Chrome trace. The ranges are read back from that JSON file: a trace is data.
Its "ts" are microseconds of the wall clock (with the file's baseTimeNanoseconds), which every rank
on one machine shares, so the ranks' ranges line up; the link's log (perf_counter) is moved onto the
same clock. Gloo only: the stand-ins sleep on the host.
"""
import json
import os
import time

import torch
import torch.distributed as dist

from helpers import standins, tiny
from machinery import l05_ddp as ddp_bench

WARMUP = 2          # profiled steps the schedule leaves out (DDP's buckets settle in the first)


def profiled_steps(rank, world_size, step, model_kw, cap_mb, layer_s, gbps, alpha_s, steps,
                   folder):
    """A rank's function for helpers.spawn: `steps` profiled calls of step(ddp, opt, x, y, sync)
    after WARMUP; returns the trace's path, the bucket plan and the link's calls (trace clock)."""
    from course.ddp import BucketedDDP
    from torch.profiler import ProfilerActivity, profile, schedule

    blocks = tiny.model(**model_kw, seed=0)
    model = torch.nn.Sequential(*[standins.DeviceLike(b, layer_s) for b in blocks])
    ddp = BucketedDDP(model, bucket_cap_mb=cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = tiny.batch(8, model_kw["dim"], seed=1 + rank)
    path = os.path.join(folder, f"device-like-cap{cap_mb:g}MiB-rank{rank}.json")
    plan = schedule(wait=0, warmup=WARMUP, active=steps, repeat=1)
    with ddp_bench.paced_all_reduce(gbps, alpha_s) as link, profile(
            activities=[ProfilerActivity.CPU], schedule=plan, acc_events=True,
            on_trace_ready=lambda prof: prof.export_chrome_trace(path)) as prof:
        wall = time.time() - time.perf_counter()       # perf_counter -> the trace's clock
        for _ in range(WARMUP + steps):
            dist.barrier()
            step(ddp, opt, x, y, ddp.finish_gradient_sync)
            prof.step()
    if any("start" not in c for c in link.calls):
        raise RuntimeError("an all-reduce on the link was never waited for: train_step must call "
                           "sync() (finish_gradient_sync) before the optimizer step")
    calls = [{"name": "bucket on the link", "start": c["start"] + wall, "end": c["end"] + wall,
              "launched": c["launched"] + wall} for c in link.calls]
    return {"trace": path, "plan": ddp_bench.bucket_plan(ddp), "link": calls}


def ranges(path, names):
    """The trace's record_function ranges called `names`, in time order: [(name, start, end)] in
    seconds of the wall clock."""
    with open(path) as f:
        trace = json.load(f)
    base = trace.get("baseTimeNanoseconds", 0) / 1e9
    return sorted((e["name"], base + e["ts"] / 1e6, base + (e["ts"] + e["dur"]) / 1e6)
                  for e in trace["traceEvents"]
                  if e.get("cat") == "user_annotation" and e.get("name") in names)


def by_step(spans, first):
    """[{name: (start, end)}] of each step: a step begins at each range called `first`."""
    out = []
    for name, s, e in sorted(spans, key=lambda t: t[1]):
        if name == first:
            out.append({})
        if out:
            out[-1][name] = (s, e)
    return out


def steps_of(runs, names=("forward", "backward", "wait for gradients", "optimizer")):
    """Per profiled step, every rank's ranges: [[{name: (start, end)} of rank r]]."""
    per_rank = [by_step(ranges(run["trace"], names), names[0]) for run in runs]
    return [list(step) for step in zip(*per_rank)]


def exposed(steps, link=()):
    """The exposed communication of each step, seconds, as the rank that finished backward last
    sees it: from the step's last bucket launch (the model's end of backward: the stamp in `link`,
    a run's log of the link; without one, the wait's start) to the end of its "wait for gradients"
    range. A rank descheduled between its launch and the range shortens the range, not the wait."""
    launched = sorted(c["launched"] for c in link)
    out = []
    for ranks in steps:
        last = max(ranks, key=lambda r: r["backward"][1])
        begin, (wait0, wait1) = min(r["forward"][0] for r in ranks), last["wait for gradients"]
        mine = [t for t in launched if begin <= t <= wait1]
        if link and not mine:
            raise ValueError("the link's log has no launch inside this step")
        out.append(wait1 - (mine[-1] if mine else wait0))
    return out


def modelled_exposed(plan, depth, layer_s, gbps, alpha_s, k):
    """Lecture 05's overlap model (course.ddp.exposed_comm) for a bucket plan [(earliest block,
    bytes)]: bucket ready when its earliest block's backward (2 layer_s a block) is done, taking
    alpha + 2(K-1)/K n/B on the link."""
    from course.ddp import exposed_comm

    ready = [(depth - j) * 2 * layer_s for j, _ in plan]
    comm = [alpha_s + 2 * (k - 1) / k * n / (gbps * 1e9) for _, n in plan]
    return exposed_comm(ready, comm)


def assert_exposed_predicted(measured_s, model_s, tolerance_s):
    """The lecture's claim: the median exposed communication read off the traces is the overlap
    model's, within what the model leaves out (tolerance_s: the copies back from the buckets, the
    sleep's wake-up, the link's clock exchange)."""
    median = sorted(measured_s)[len(measured_s) // 2]
    assert abs(median - model_s) <= tolerance_s, (
        f"exposed communication {median * 1e3:.1f} ms, model {model_s * 1e3:.1f} ms "
        f"(tolerance {tolerance_s * 1e3:.1f} ms)")
    return median
