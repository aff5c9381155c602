"""Lecture 08's pieces that later lectures reuse, exactly as notebooks/08_pipeline_parallel.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import torch
import torch.distributed as dist
from helpers import timing, tiny
from torch import nn


def stage_module(model, stage, p):
    """Stage `stage` of p: its run of consecutive blocks of `model`."""
    per = len(model) // p
    return nn.Sequential(*list(model)[stage * per:(stage + 1) * per])


def gpipe(p, m, stage):
    """GPipe: all m forwards, then all m backwards."""
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def one_f_one_b(p, m, stage):
    """1F1B: p - stage - 1 warm-up forwards, then one forward one backward, then the
    remaining backwards."""
    warmup = min(p - stage - 1, m)
    actions = [("F", i) for i in range(warmup)]
    for i in range(warmup, m):
        actions += [("F", i), ("B", i - warmup)]
    return actions + [("B", i) for i in range(m - warmup, m)]


SCHEDULES = {"GPipe": gpipe, "1F1B": one_f_one_b}


def count_saved(sizes, params):
    """Pack hook: sizes[(address, numel)] = bytes of a saved tensor, parameters out."""
    def pack(t):
        if t.data_ptr() not in params:
            sizes[(t.data_ptr(), t.numel())] = t.numel() * t.element_size()
        return t
    return pack

def run_schedule(stage, actions, xs, ys, rank, p, work=None):
    """One step of this stage: `actions` in order on micro-batches xs, ys, work(kind)
    after each; a ("W", i) splits i's backward in two (Optional). Returns [(kind, i,
    start, end)] (seconds), the most micro-batches and bytes held at once, the loss."""
    m, first, last = len(xs), rank == 0, rank == p - 1
    params = {q.data_ptr() for q in stage.parameters()}
    held, saved, grads, pending, in_flight = {}, {}, {}, [], []
    clock, marks, loss = timing.Clock(xs[0].device), [], 0.0
    def exchange(recv=None):    # the pending sends and this receive, as one group
        ops = pending + ([recv] if recv is not None else [])
        works = dist.batch_isend_irecv(ops) if ops else []
        if recv is not None:    # gloo: the receive's own work; NCCL: the group's one
            works.pop().wait()
        sent = in_flight + [(works, [op.tensor for op in pending])]   # NCCL, waited: []
        in_flight[:] = [f for f in sent if not all(w.is_completed() for w in f[0])]
        pending.clear()

    clock.now("step start")
    for n, (kind, i) in enumerate(actions):
        edge = first if kind == "F" else last if kind == "B" else True   # W: no input
        buf = torch.empty_like(xs[i] if kind == "F" else held[i][1])
        source = rank - 1 if kind == "F" else rank + 1
        exchange(None if edge else dist.P2POp(dist.irecv, buf, source))
        clock.now((n, "start"))
        if kind == "F":
            inp = xs[i] if first else buf.requires_grad_()
            sizes = {}
            hooks = count_saved(sizes, params), lambda t: t     # unpack: as saved
            with torch.autograd.graph.saved_tensors_hooks(*hooks):
                out = stage(inp)
                if last:
                    out = tiny.loss(out, ys[i]) / m     # this micro-batch's share
            held[i], saved[i] = (inp, out), sum(sizes.values())
            marks.append((len(held), sum(saved.values())))     # held at once
            if last:
                loss = loss + out.detach()
            else:
                pending.append(dist.P2POp(dist.isend, out.detach(), rank + 1))
        elif kind == "B":
            inp, out = held[i]
            grads[i] = torch.ones_like(out) if last else buf
            if not first and ("W", i) in actions:   # split: the input's gradient now
                g, = torch.autograd.grad(out, inp, grads[i], retain_graph=True)
                pending.append(dist.P2POp(dist.isend, g, rank - 1))
        if kind == "W" or kind == "B" and ("W", i) not in actions:  # W, or a whole B
            inp, out = held.pop(i)
            whole = [inp] if kind == "B" and not first else []   # the input's too
            wrt = [*stage.parameters(), *whole]
            torch.autograd.backward(out, grads.pop(i), inputs=wrt)
            pending += [dist.P2POp(dist.isend, x.grad, rank - 1) for x in whole]
            saved.pop(i)                                # autograd freed it
        if work:
            work(kind)
        clock.now((n, "end"))
    exchange()
    [w.wait() for works, _ in in_flight for w in works]
    t = clock.read()                    # seconds since "step start"
    timeline = [(k, i, t[n, "start"], t[n, "end"]) for n, (k, i) in enumerate(actions)]
    return timeline, *map(max, zip(*marks)), float(loss)    # the peaks

def simulate(schedule, p, m, time=None, hop=0.0, send_s=0.0):
    """[(stage, kind, i, start, end)]: each stage runs its actions in order, each as
    soon as the stage is free and its input is there, `hop` after the action making it,
    whose stage stays busy `send_s` more if it sends (section 4).
    time(stage, kind): an action's duration (default t_f = 1, t_b = 2). An action
    (kind, i, c) runs chunk c of v on its rank, virtual stage c p + stage (Optional)."""
    time = time or (lambda s, kind: 2.0 if kind == "B" else 1.0)
    queues = [list(schedule(p, m, s)) for s in range(p)]
    v = 1 + max(a[2] if len(a) > 2 else 0 for q in queues for a in q)  # chunks a rank
    done, free, events = {}, [0.0] * p, []
    while any(queues):
        progressed = False
        for s in range(p):
            while queues[s]:
                kind, i, c = (queues[s][0] + (0,))[:3]
                k = c * p + s                                      # virtual stage
                own = kind == "W" or kind == "B" and k == v * p - 1    # needs its own
                need = (("F", k - 1, i) if kind == "F" and k > 0 else
                        ("B", k + 1, i) if kind == "B" and not own else
                        ("F" if kind == "B" else "B", k, i) if own else None)
                if need is not None and need not in done:
                    break
                start = max(free[s], done[need] + (0 if own else hop) if need else 0.0)
                done[kind, k, i] = end = start + time(s, kind)
                sends = kind == "F" and k < v * p - 1 or kind == "B" and k > 0
                free[s] = end + (send_s if sends else 0.0)
                events.append((s, kind, i, start, end))
                queues[s].pop(0)
                progressed = True
        if not progressed:
            raise RuntimeError("the schedule deadlocks: each stage waits on an action")
    return events


def step_time(events):
    """From the first start to the last end."""
    return max(e[4] for e in events) - min(e[3] for e in events)


def bubble(events, p):
    """Idle fraction: 1 - (busy time over all stages) / (p x step time)."""
    return 1 - sum(e[4] - e[3] for e in events) / (p * step_time(events))

def predicted_step(schedule, p, m, events, hop):
    """The step `schedule` takes with the measured mean time of each stage's F, B (and
    W) actions in `events`, each input arriving `hop` after the action that made it,
    whose stage the send keeps as long."""
    times = {(s, k): [e[4] - e[3] for e in events if e[0] == s and e[1] == k]
             for s in range(p) for k in "FBW"}
    mean = {key: sum(t) / len(t) for key, t in times.items() if t}
    return step_time(simulate(schedule, p, m, lambda s, k: mean[s, k], hop, hop))


def hop_steps(schedule, p, m, forward_s, hop_s):
    """(step without hops, step with hops of hop_s, each keeping its sender too) of
    `schedule` whose forwards take forward_s and backwards twice that."""
    time = lambda s, kind: forward_s * (2 if kind == "B" else 1)
    return tuple(step_time(simulate(schedule, p, m, time, h, h)) for h in (0.0, hop_s))


def assert_step_predicted(step, predicted, rel=0.15):
    """A measured step is the predicted one within `rel` of it (Python between actions
    and wake-ups, which the model leaves out)."""
    assert abs(step - predicted) <= rel * predicted, (step, predicted)

def zb_h1(p, m, stage):
    """ZB-H1: 1F1B with each backward split into B then W, W lagging s micro-batches."""
    warmup = min(p - stage - 1, m)
    acts = [("F", i) for i in range(warmup)]
    for b in range(m):
        acts += [("F", b + warmup)] if b + warmup < m else []
        acts += [("B", b)] + ([("W", b - stage)] if b >= stage else [])
    return acts + [("W", i) for i in range(max(m - stage, 0), m)]
