"""Lecture 05 (DDP): its shape, its key measured claim with negative controls, and the checks
moved out of the notebook (torch DDP's no_sync, the optional section's knobs).

The claim (notebooks/05_ddp.ipynb, section 5): on the H100 model (device-like d = 4096 blocks on
2048 tokens; every all-reduce lecture 02's ring over the model's NVLink on a comm stream,
machinery.l05_ddp.on_model; compute beside it slowed by the contention average), a BucketedDDP
step with a bucket per block takes the step without communication plus `exposed_comm` of the
buckets' ready times and the model's ring times (plus the laptop's floor, the least round of the
ring unpaced in the same rounds), within the spread of the rounds (p10-p90 of step minus
no-communication step), the floor's (helpers.timing.floor) and the floor itself (how much of it
a paced step keeps is not known).
The stand-in knows the ring and the contention, not DDP's schedule. Two negative controls fail it:
- a wrong algorithm: the same buckets launched first-layer first (the first bucket to leave is
  ready only when backward ends, so nothing hides), against the right model;
- a wrong machine: the right run against the model of a ring on PCIe (64 GB/s a direction, an
  H100 without NVLink), where the link falls behind backward.

The pieces are imported from notebooks/course/ddp.py, which is what the lecture shows
(tests/test_saved.py). The stand-ins take time on a clock that needs no core, so the timings hold on
a loaded machine; the timed test takes a few seconds.
"""
import contextlib
import functools
import statistics
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from course.ddp import (BucketedDDP, assert_near_overlap_model, average_gradients_naive,
                        exposed_comm, sgd_update)
from helpers import cost, machines, standins, timing, tiny, trace
from machinery import l05_ddp as ddp_bench
from helpers.site import shape
from helpers.spawn import device, spawn

LECTURE = Path(shape.NOTEBOOKS) / "05_ddp.ipynb"
H100 = machines.Scaled(machines.H100, time=15, bytes=256)       # the lecture's H100 model
FORWARD_S = H100.compute(2 * 8 * 4096**2 * 2048)                 # a d = 4096 block, 2048 tokens
SHARE = machines.H100.contention[0]
MODEL = dict(dim=128, hidden=512, depth=4)                       # 4 blocks of 1.005 MiB
STEPS = 7


def _model():
    return torch.nn.Sequential(*[standins.DeviceLike(b, FORWARD_S) for b in tiny.model(**MODEL)])


def _ddp_step(ddp, x, y):
    ddp.module.zero_grad()
    tiny.loss(ddp(x), y).backward()
    ddp.finish_gradient_sync()
    sgd_update(ddp.module, 1e-3)


def _first_layer_first(ddp):
    """A wrong algorithm: the same buckets, launched in the order of the model's layers."""
    n = len(ddp.buckets)
    ddp.buckets.reverse()
    ddp.flat.reverse()
    ddp.slot = {p: (n - 1 - i, view) for p, (i, view) in ddp.slot.items()}
    ddp._new_backward()
    return ddp


def _timed(rank, world_size):
    x, y = tiny.batch(8, MODEL["dim"], seed=1 + rank)
    link = functools.partial(ddp_bench.on_model, H100, SHARE)
    ddp = BucketedDDP(_model(), bucket_cap_mb=1)
    wrong = _first_layer_first(BucketedDDP(_model(), bucket_cap_mb=1))
    variants = {"no communication": (functools.partial(_ddp_step, ddp, x, y),
                                     ddp_bench.without_all_reduce),
                "bucketed": (functools.partial(_ddp_step, ddp, x, y), link),
                "first layer first": (functools.partial(_ddp_step, wrong, x, y), link),
                "floor": (lambda: [*map(dist.all_reduce, ddp.flat)],
                          functools.partial(ddp_bench.on_model, None))}
    return ddp_bench.time_steps(variants, steps=STEPS, warmup=1), ddp_bench.bucket_plan(ddp)


@pytest.fixture(scope="module")
def timed():
    runs = spawn(_timed, 2, backend="gloo", timeout=120)
    steps = {n: ddp_bench.slowest_rank([t for t, _ in runs], n) for n in runs[0][0]}
    return steps, runs[0][1]


def _check(steps, name, plan, bw):
    """The lecture's claim for the run `name` against the model of a ring of B = bw."""
    alpha = machines.link(machines.H100)[0]
    f = timing.floor(steps["floor"])               # its least round, a bucket's share
    comm = [H100.wall(cost.ring_all_reduce(n * H100.bytes, 2, bw, alpha))
            + f["least"] / len(plan) for _, n in plan]
    ready = [(MODEL["depth"] - j) * 2 * FORWARD_S for j, _ in plan]
    r = timing.summary([a - b for a, b in zip(steps[name], steps["no communication"])])
    assert_near_overlap_model(statistics.median(steps[name]),
                              statistics.median(steps["no communication"]),
                              exposed_comm(ready, comm, SHARE),
                              r["p90"] - r["p10"] + f["spread"] + f["least"])


def test_the_bucketed_step_meets_the_overlap_model_and_first_layer_first_does_not(timed):
    steps, plan = timed
    assert len(plan) == 4
    _check(steps, "bucketed", plan, machines.ring_bw(machines.H100))
    with pytest.raises(AssertionError):
        _check(steps, "first layer first", plan, machines.ring_bw(machines.H100))


def test_the_claim_fails_against_a_wrong_machine(timed):
    steps, plan = timed
    with pytest.raises(AssertionError):            # a ring over PCIe: the link falls behind
        _check(steps, "bucketed", plan, machines.H100.pcie_bw)


def test_exposed_comm():
    assert exposed_comm([1.0, 2.0, 3.0], [0.5, 0.5, 0.5]) == pytest.approx(0.5)
    assert exposed_comm([3.0, 3.0], [1.0, 2.0]) == pytest.approx(3.0)   # all at the end
    assert exposed_comm([0.0, 3.0], [4.0, 1.0]) == pytest.approx(2.0)   # the link queues


def test_exposed_comm_slows_the_compute_beside_the_link():
    # a bucket ready at 1 takes 1 on the link, while compute runs 1.5x slower: that second
    # does 2/3 s of backward's work, so backward ends 1/3 s late; then the last bucket, 0.5
    assert exposed_comm([1.0, 3.0], [1.0, 0.5], share=0.5) == pytest.approx(1 / 3 + 0.5)
    # the link is through before the last bucket: share changes nothing when it is 0
    assert exposed_comm([1.0, 3.0], [1.0, 0.5], share=0.0) == pytest.approx(0.5)


def _no_sync_torch(rank, world_size):
    model, count = tiny.model(dim=16, hidden=32, depth=3), [0]

    def hook(count, bucket):
        count[0] += 1
        return default_hooks.allreduce_hook(None, bucket)

    ddp = DistributedDataParallel(model, bucket_cap_mb=0.004)
    ddp.register_comm_hook(count, hook)
    x, y = tiny.batch(8, 16, seed=1 + rank)
    with ddp.no_sync():
        tiny.loss(ddp(x[:4]), y[:4]).backward()
    inside = count[0]
    tiny.loss(ddp(x[4:]), y[4:]).backward()
    return inside, count[0] - inside


def test_torch_ddp_runs_no_collective_inside_no_sync():
    for inside, after in spawn(_no_sync_torch, 2, backend="gloo"):
        assert inside == 0 and after == 1        # its first iteration: one bucket


def _forward_decides(rank, world_size, wrapper):
    """All-reduces of a backward whose forward ran outside no_sync, and of one whose forward
    ran inside it (backward outside): torch decides at forward, and so must BucketedDDP."""
    model = tiny.model(dim=16, hidden=32, depth=3)
    ddp, x, y = wrapper(model, bucket_cap_mb=0.004), *tiny.batch(8, 16, seed=1 + rank)
    counts = []
    for inside_forward in (False, True):
        model.zero_grad()
        with ddp.no_sync() if inside_forward else contextlib.nullcontext():
            loss = tiny.loss(ddp(x), y)
        with trace.calls() as log, contextlib.ExitStack() as stack:
            if not inside_forward:
                stack.enter_context(ddp.no_sync())      # backward inside: still synced
            loss.backward()
            if wrapper is BucketedDDP:
                ddp.finish_gradient_sync()
        counts.append(log.count("all_reduce"))
    return counts


def test_no_sync_is_decided_at_forward_as_in_torch():
    ours = spawn(_forward_decides, 2, args=(BucketedDDP,), backend="gloo")[0]
    assert ours[0] == 6 and ours[1] == 0, ours               # 6 buckets of the 4.2 kB cap
    torchs = spawn(_forward_decides, 2, args=(DistributedDataParallel,), backend="gloo")[0]
    assert torchs[0] >= 1 and torchs[1] == 0, torchs         # first iteration: one bucket


class _WithUnused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = tiny.model(dim=16, hidden=32, depth=2), torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.used(x)


def _knobs(rank, world_size):
    dev, out = device(), {}
    sampler = DistributedSampler(list(range(20)), num_replicas=world_size, rank=rank, seed=0)
    out["epoch 0"], out["epoch 0 again"] = list(sampler), list(sampler)
    sampler.set_epoch(1)
    out["epoch 1"] = list(sampler)
    n = 4 * world_size + 1
    for drop in (False, True):
        out[f"drop_last={drop}"] = list(DistributedSampler(
            list(range(n)), num_replicas=world_size, rank=rank, shuffle=False, drop_last=drop))
    x, y = tiny.batch(8, 16, seed=1 + rank)
    for label, kw in (("plain", {}), ("find_unused", {"find_unused_parameters": True}),
                      ("static_graph", {"static_graph": True})):
        model = _WithUnused().double()
        ddp = DistributedDataParallel(model, **kw)
        try:
            for _ in range(3):
                model.zero_grad()
                tiny.loss(ddp(x), y).backward()
            out[label] = "ran"
        except RuntimeError as e:
            out[label] = "RuntimeError: " + str(e).splitlines()[0]
    for view in (False, True):
        model = tiny.model(dim=16, hidden=32, depth=3, device=dev)
        ddp = DistributedDataParallel(model, gradient_as_bucket_view=view)
        for _ in range(2):                        # the second iteration has the rebuilt buckets
            model.zero_grad()
            tiny.loss(ddp(x), y).backward()
        out[f"view={view}"] = len({p.grad.untyped_storage().data_ptr() for p in model.parameters()})
    return out


def test_the_optional_sections_knobs():
    k = 2
    got = spawn(_knobs, k, backend="gloo")
    r0 = got[0]
    assert r0["epoch 0"] == r0["epoch 0 again"] != r0["epoch 1"]       # set_epoch reshuffles
    n = 4 * k + 1
    padded = sorted(i for r in got for i in r["drop_last=False"])
    dropped = sorted(i for r in got for i in r["drop_last=True"])
    assert len(padded) == k * -(-n // k) and set(padded) == set(range(n))   # padded by repeats
    assert len(dropped) == k * (n // k) and len(set(dropped)) == len(dropped)
    assert r0["plain"].startswith("RuntimeError")                       # the unused branch
    assert r0["find_unused"] == "ran" and r0["static_graph"] == "ran"
    n_params = len(list(tiny.model(dim=16, hidden=32, depth=3).parameters()))
    assert r0["view=False"] == n_params > r0["view=True"]               # one storage per bucket


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0


class _EagerDDP(BucketedDDP):
    """Wrong on purpose: a bucket leaves as soon as its first gradient is in."""

    def _grad_ready(self, p):
        i, view = self.slot[p]
        torch.div(p.grad.view(-1), self.world_size, out=view)
        self.pending[i] -= 1
        if i == self.next:
            self.works.append(dist.all_reduce(self.flat[i], async_op=True))
            self.next += 1


def test_the_recorded_buckets_are_the_rule_and_an_eager_launch_is_not():
    """Section 4's picture (issue 48): one backward of BucketedDDP, recorded (a hook on each
    parameter before the DDP's, and its launches), is the rule's sequence of gradients and
    launches (l05_buckets.spec) on every rank; a DDP that launches a bucket at its first
    gradient, and the rule at another cap, record otherwise."""
    from machinery import l05_buckets as bucket_figures
    cfg, cap = dict(dim=16, hidden=32, depth=3), 0.004
    sizes = [p.numel() * 8 for p in tiny.model(**cfg).parameters()][::-1]
    rule = bucket_figures.spec(sizes, cap * 2**20)
    right, eager = (spawn(bucket_figures.record, 2,
                          args=(functools.partial(wrap, bucket_cap_mb=cap), cfg, 0, 1))
                    for wrap in (BucketedDDP, _EagerDDP))
    bucket_figures.assert_rule(right, rule)
    with pytest.raises(AssertionError, match="rank 0, event 1: bucket 0's all-reduce launched; "
                                             "the rule says gradient 1 ready"):
        bucket_figures.assert_rule(eager, rule)
    with pytest.raises(AssertionError):
        bucket_figures.assert_rule(right, bucket_figures.spec(sizes, 0.01 * 2**20))


class _WhenFullDDP(BucketedDDP):
    """Wrong on purpose: a bucket leaves as soon as it is full, whether or not the earlier have."""

    def _grad_ready(self, p):
        i, view = self.slot[p]
        torch.div(p.grad.view(-1), self.world_size, out=view)
        self.pending[i] -= 1
        if not self.pending[i]:
            self.works.append(dist.all_reduce(self.flat[i], async_op=True))
            self.next += 1


class _UsedOutOfOrder(torch.nn.Module):
    """Registered a, then b; applied b, then a: a's gradients are ready first, so the bucket of
    b's (first in reverse registration) fills after a's."""

    def __init__(self, flip=False):
        super().__init__()
        self.a, self.b, self.flip = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), flip

    def forward(self, x):
        return self.b(self.a(x)) if self.flip else self.a(self.b(x))


def _launch_order(rank, world_size, wrap, by_rank=False):
    model = _UsedOutOfOrder(flip=by_rank and rank == 1)
    ddp, order = wrap(model, bucket_cap_mb=1e-3), []     # 1 kB: a layer a bucket
    index = {f.data_ptr(): j for j, f in enumerate(ddp.flat)}
    real = dist.all_reduce
    dist.all_reduce = lambda t, *a, **k: order.append(index[t.data_ptr()]) or real(t, *a, **k)
    try:
        ddp(torch.ones(4, 16)).sum().backward()
    finally:
        dist.all_reduce = real
    ddp.finish_gradient_sync()
    return order


def test_buckets_leave_in_bucket_order_when_a_later_one_fills_first():
    """Section 4's 'buckets launch in bucket order, so every rank issues the same collectives in
    the same order', where the backward fills them out of order; a DDP that launches a bucket as
    soon as it is full does not."""
    assert spawn(_launch_order, 2, args=(BucketedDDP,)) == [[0, 1], [0, 1]]
    assert spawn(_launch_order, 2, args=(_WhenFullDDP,)) == [[1, 0], [1, 0]]
    # where the ranks' gradients come in different orders (the layers applied in another order on
    # rank 1), launching once full makes the ranks call the two all-reduces in different orders:
    # gloo then sums one rank's bucket 0 with the other's bucket 1 (the same size), silently
    assert spawn(_launch_order, 2, args=(BucketedDDP, True)) == [[0, 1], [0, 1]]
    assert spawn(_launch_order, 2, args=(_WhenFullDDP, True)) == [[1, 0], [0, 1]]
