"""Measuring machinery of the profiling lecture (09): a profiled DDP run on the H100 model and
the per-iteration breakdown read off its Chrome traces.

    runs = spawn(profile_bench.profiled_steps, k, backend="gloo",
                 args=(train_step, model_kw, cap_mb, forward_s, scaled, share, steps, folder))
    steps = profile_bench.steps_of(runs)          # per step, per rank: {range: (start, end)} s
    measured = profile_bench.exposed(steps, [r["link"] for r in runs])  # last launch to wait's end
    model = profile_bench.modelled_exposed(runs[0]["plan"], depth, backward_s, comm_s)
    profile_bench.assert_exposed_predicted(measured, profile_bench.floor_rounds(runs), model)

`profiled_steps` wraps the lecture's plain step from outside: lecture 05's BucketedDDP over the
tiny model whose blocks are `standins.DeviceLike` (forward_s a block, backward twice that, without
a core), every all-reduce lecture 02's ring over the scaled model's paced link on a comm stream
(`ddp_bench.on_model`, compute beside it slowed by `share`), under `torch.profiler.profile` with a
schedule (2 warm-up steps) and a trace handler that writes each rank's Chrome trace; then it
times the same buckets' all-reduces on an unpaced link (the laptop's floor). The ranges are read
back from that JSON file: a trace is data. Its "ts" are microseconds of the wall clock (with the
file's baseTimeNanoseconds), which every rank on one machine shares, so the ranks' ranges line
up; the link's log (perf_counter) is moved onto the same clock. Gloo only: the stand-ins sleep on
the host.
"""
import json
import os
import time

import torch
import torch.distributed as dist

from helpers import standins, timing, tiny
from machinery import l05_ddp as ddp_bench

WARMUP = 2          # profiled steps the schedule leaves out (DDP's buckets settle in the first)
FLOOR_ROUNDS = 7    # steps on the unpaced link, at most (their median and spread are used)


def profiled_steps(rank, world_size, step, model_kw, cap_mb, forward_s, scaled, share, steps,
                   folder):
    """A rank's function for helpers.spawn: `steps` profiled calls of step(ddp, opt, x, y, sync)
    after WARMUP on the scaled model; returns the trace's path, the bucket plan, this rank's log
    of its all-reduces (trace clock; "launched": when this rank queued each) and the floor, what
    the same steps expose on an unpaced link (seconds, up to FLOOR_ROUNDS rounds: the last
    bucket's real all-reduce and the copies back; no profiler)."""
    from course.ddp import BucketedDDP
    from torch.profiler import ProfilerActivity, profile, schedule

    blocks = tiny.model(**model_kw, seed=0)
    model = torch.nn.Sequential(*[standins.DeviceLike(b, forward_s) for b in blocks])
    ddp = BucketedDDP(model, bucket_cap_mb=cap_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = tiny.batch(8, model_kw["dim"], seed=1 + rank)
    path = os.path.join(folder, f"device-like-cap{cap_mb:g}MiB-rank{rank}.json")
    plan = schedule(wait=0, warmup=WARMUP, active=steps, repeat=1)
    with ddp_bench.on_model(scaled, share) as link, profile(
            activities=[ProfilerActivity.CPU], schedule=plan, acc_events=True,
            on_trace_ready=lambda prof: prof.export_chrome_trace(path)) as prof:
        wall = time.time() - time.perf_counter()       # perf_counter -> the trace's clock
        for _ in range(WARMUP + steps):
            dist.barrier()
            step(ddp, opt, x, y, ddp.finish_gradient_sync)
            prof.step()
    floor = []                    # the same steps on an unpaced link: what is exposed there
    for _ in range(min(steps, FLOOR_ROUNDS)):
        with ddp_bench.on_model(None) as unpaced:
            dist.barrier()
            done = []
            step(ddp, opt, x, y, lambda: (ddp.finish_gradient_sync(),
                                          done.append(time.perf_counter())))
        floor.append(done[0] - unpaced.calls[-1]["queued"])
    calls = [{"name": "bucket on the link", "start": c["start"] + wall, "end": c["end"] + wall,
              "launched": c["queued"] + wall} for c in link.calls]
    return {"trace": path, "plan": ddp_bench.bucket_plan(ddp), "link": calls, "floor": floor}


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


def exposed(steps, links=None):
    """The exposed communication of each step, seconds, as the rank that finished backward last
    sees it: from its last bucket launch in the step (the model's end of backward: the stamp in
    its log of the link, `links[rank]`; without logs, the wait's start) to the end of its "wait
    for gradients" range. A rank descheduled between its launch and the range shortens the
    range, not the wait."""
    out = []
    for ranks in steps:
        r = max(range(len(ranks)), key=lambda i: ranks[i]["backward"][1])
        begin, (wait0, wait1) = ranks[r]["forward"][0], ranks[r]["wait for gradients"]
        mine = sorted(c["launched"] for c in links[r] if begin <= c["launched"] <= wait1) \
            if links else []
        if links and not mine:
            raise ValueError("the link's log has no launch inside this step")
        out.append(wait1 - (mine[-1] if mine else wait0))
    return out


def modelled_exposed(plan, depth, backward_s, comm_s):
    """Lecture 05's overlap model (course.ddp.exposed_comm) for a bucket plan [(earliest block,
    bytes)]: bucket ready when its earliest block's backward (backward_s a block) is done, taking
    comm_s(bytes) on the link. No contention: read from the last launch, a backward slowed
    before it is left out, and the link is free at that launch wherever it kept up."""
    from course.ddp import exposed_comm

    ready = [(depth - j) * backward_s for j, _ in plan]
    return exposed_comm(ready, [comm_s(n) for _, n in plan])


def floor_rounds(runs):
    """Per round, the most any rank exposed on the unpaced link (profiled_steps' "floor")."""
    return [max(f) for f in zip(*(run["floor"] for run in runs))]


def assert_exposed_predicted(measured_s, floor_s, model_s):
    """The lecture's claim: the median exposed communication read off the traces, less the
    floor (the least round the same steps expose on an unpaced link: the real last all-reduce,
    the copies back), is the overlap model's, within timing.above_floor's tolerance (the
    rounds' spread, the floor's, and the floor itself)."""
    a = timing.above_floor(measured_s, floor_s)
    assert abs(a["median"] - model_s) <= a["tolerance"], (
        f"exposed communication {(a['median'] + a['floor']) * 1e3:.1f} ms, model "
        f"{model_s * 1e3:.1f} ms + floor {a['floor'] * 1e3:.1f} ms (tolerance "
        f"{a['tolerance'] * 1e3:.1f} ms)")
    return a["median"] + a["floor"]
