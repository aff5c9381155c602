"""Measuring machinery of the pipeline lecture (08): timed steps on device-like stages.

    runs = spawn(pp_bench.timed_steps, p, args=(schedule, ms, work_ms, dim, hidden, depth, micro))
    ev = pp_bench.events_of(runs, m)        # [(stage, kind, i, start, end)] of step m, seconds
    hop = pp_bench.hop_of(runs)             # one-way latency of an activation, ping-pong, seconds
    runs = spawn(pp_bench.rounds, p, args=(plans, m, n, dim, hidden, depth, micro))
    ev = pp_bench.events_of(runs, (name, r))   # plan `name`'s round r, plans run in turn
    runs = spawn(pp_bench.hop_rounds, p,
                 args=(schedule, m, n, work_ms, link, dim, hidden, depth, micro))
    added = pp_bench.hops_added(runs, n, bare)     # timing.above_floor of the paced rounds

It wraps the lecture's plain engine (course.pipeline_parallel.run_schedule) from outside: each
action's extra work is `standins.device_compute` (work_ms a forward and twice that a backward,
or {kind: ms} for every kind of action: "F", "B", "W"), which takes its time without a core (a host
sleep on the CPU, a kernel spinning on the stream on a GPU), so p stages overlap even on 2 cores.
Given a link, (gbps, alpha_s) of standins.paced_link (helpers.machines.Scaled.paced: the H100
model's NIC), every message between stages pays its time, the sender's host sleeping it (gloo).
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


def timed_steps(rank, p, schedule, ms, work_ms, dim, hidden, depth, micro, link=None):
    """{m: (timeline, peak micro-batches, peak bytes)} for each m in ms, and {"hop": seconds}
    (rank 0's; None elsewhere), the steps over standins.paced_link(*link) if given (gloo)."""
    stage, work, dev = _setup(rank, p, work_ms, dim, hidden, depth)
    with standins.paced_link(*(link or (None,))):
        hops = [_hop(rank, (micro, dim), dev)]
        out = {}
        for m in [ms[0]] + list(ms):               # the first run is a warm-up
            out[m] = _step(stage, schedule, m, work, rank, p, dim, micro, dev)
        hops.append(_hop(rank, (micro, dim), dev))  # before and after: the fastest
    out["hop"] = min(hops) if rank == 0 else None
    return out


def hop_rounds(rank, p, schedule, m, n, work_ms, link, dim, hidden, depth, micro):
    """{(paced, r): (timeline, peak micro-batches, peak bytes)} of n rounds of a step of m
    micro-batches, each on standins.paced_link(*link) (paced=True) and then on an unpaced
    link (the floor), after a warm-up round."""
    stage, work, dev = _setup(rank, p, work_ms, dim, hidden, depth)
    out = {}
    for r in [0] + list(range(n)):                 # the first round is a warm-up
        for paced in (True, False):
            with standins.paced_link(*(link if paced else (None,))):
                out[paced, r] = _step(stage, schedule, m, work, rank, p, dim, micro, dev)
    return out


def step_times(per_rank, keys):
    """The step time (course.pipeline_parallel.step_time) of each key's events_of."""
    from course.pipeline_parallel import step_time
    return [step_time(events_of(per_rank, key)) for key in keys]


def hops_added(per_rank, n, bare):
    """What the paced link's hops added to the step of hop_rounds' n rounds: timing.above_floor
    of the paced rounds over the unpaced ones, whose model (`bare`) is the step without hops."""
    from helpers import timing
    paced, unpaced = (step_times(per_rank, [(p, r) for r in range(n)]) for p in (True, False))
    return timing.above_floor(paced, unpaced, bare)


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


def draw_schedule(ax, events, p, title):
    """Gantt chart of [(stage, kind, i, start, end)]: a row per stage, forwards and backwards
    coloured, each bar labelled with its micro-batch where it is wide enough."""
    from course.pipeline_parallel import step_time
    from helpers import plots
    t0, width = min(e[3] for e in events), step_time(events)
    ax.barh([e[0] for e in events], [e[4] - e[3] for e in events],
            left=[e[3] - t0 for e in events], height=0.8, edgecolor="k", linewidth=0.4,
            color=[plots.COLORS[0] if e[1] == "F" else plots.COLORS[1] for e in events])
    for s, kind, i, start, end in events if len(events) <= 160 else []:
        if end - start > width / 50:
            ax.text((start + end) / 2 - t0, s, str(i), ha="center", va="center",
                    fontsize=7, color="w")
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)])
    ax.set_ylim(p - 0.5, -0.5)
    ax.grid(False)
    ax.set_title(title, fontsize=9, loc="left")


def draw_schedules(panels, p, xlabel):
    """One Gantt chart (draw_schedule) a row, for each (events, title) of `panels`."""
    import matplotlib.pyplot as plt
    from helpers import plots
    fig, axes = plots.figure(nrows=len(panels), width=11, height=0.4 + 2.2 * len(panels),
                             sharex=True)
    for ax, (events, title) in zip(axes, panels):
        draw_schedule(ax, events, p, title)
    axes[-1].set_xlabel(xlabel)
    legend = [plt.Rectangle((0, 0), 1, 1, color=plots.COLORS[k], label=label)
              for k, label in enumerate(["forward", "backward"])]
    axes[0].legend(handles=legend, loc="lower right", ncol=2, fontsize=8)
    fig.subplots_adjust(hspace=0.45)
    return fig
