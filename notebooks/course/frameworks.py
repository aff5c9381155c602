"""Lecture 15's pieces that later lectures reuse, exactly as notebooks/15_frameworks.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import copy
import torch
from concurrent.futures import ThreadPoolExecutor
from course.ddp import sgd_update
from helpers import tiny


def to_device(t, i):
    """t on device i. Every device here is this CPU: a copy stands in for the transfer
    (on GPUs: t.to(f"cuda:{i}"))."""
    return t.detach().clone()


def scatter(t, k):
    """Chunk i of t on device i; chunk 0 stays on device 0."""
    return [c if i == 0 else to_device(c, i) for i, c in enumerate(t.chunk(k))]


def replicate(model, k):
    """The model on devices 1..k-1 (every parameter crosses); replica 0 is the model."""
    return [model] + [copy.deepcopy(model) for i in range(1, k)]


def parallel_apply(fns):
    """Call every fn in a thread of its own, as DataParallel does (one per device)."""
    with ThreadPoolExecutor(len(fns)) as pool:
        return list(pool.map(lambda fn: fn(), fns))


def gather(outs):
    """The replicas' outputs, concatenated on device 0."""
    return torch.cat([outs[0].detach()] + [to_device(o, 0) for o in outs[1:]])


def reduce_gradients(replicas):
    """Add every replica's gradients into the model's (replica 0), on device 0."""
    with torch.no_grad():
        for replica in replicas[1:]:
            for p, q in zip(replicas[0].parameters(), replica.parameters()):
                p.grad += to_device(q.grad, 0)


def data_parallel_step(model, x, y, k, lr):
    """One SGD step of nn.DataParallel over k devices; model, x, y are on device 0."""
    model.zero_grad()
    xs, replicas = scatter(x, k), replicate(model, k)
    outs = parallel_apply([lambda r=r, xi=xi: r(xi) for r, xi in zip(replicas, xs)])
    out = gather(outs).requires_grad_()   # a new leaf: the graph is cut here on purpose
    tiny.loss(out, y).backward()          # on device 0, the whole batch: fills out.grad
    grads = scatter(out.grad, k)          # d loss/d out_i to device i (Gather backward)
    parallel_apply([lambda o=o, g=g: o.backward(g) for o, g in zip(outs, grads)])
    reduce_gradients(replicas)
    sgd_update(model, lr)
