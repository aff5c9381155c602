"""Lecture 05 (DDP): its shape, its key measured claim with negative controls, and the checks
moved out of the notebook (torch DDP's no_sync, the optional section's knobs).

The claim (notebooks/05_ddp.ipynb, section 5): with device-like blocks (standins.DeviceLike) and
the paced all-reduce (machinery.l05_ddp), a BucketedDDP step takes the step without communication
plus the communication left after backward (`exposed_comm` of the buckets' ready times and link
times, computed from the stand-ins' settings), within the lecture's 12 ms (what the model
leaves out; `assert_near_overlap_model`). Two negative controls must fail it:
- naive DDP (every all-reduce after backward) measured against the bucketed model: it pays all
  of the communication, over a hundred ms more than the model allows;
- the bucketed step measured against a model off on purpose (one bucket: nothing hidden).

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
from helpers import standins, tiny, trace
from machinery import l05_ddp as ddp_bench
from helpers.site import shape
from helpers.spawn import device, spawn

LECTURE = Path(shape.NOTEBOOKS) / "05_ddp.ipynb"
GBPS, ALPHA_S, LAYER_S = 0.125, 8e-3, 12.5e-3    # the lecture's stand-ins
TOLERANCE_S = 12e-3                                # and its tolerance
MODEL = dict(dim=128, hidden=512, depth=4)         # 4 blocks of 1.005 MiB


def _model():
    return torch.nn.Sequential(*[standins.DeviceLike(b, LAYER_S) for b in tiny.model(**MODEL)])


def _ddp_step(ddp, x, y):
    ddp.module.zero_grad()
    tiny.loss(ddp(x), y).backward()
    ddp.finish_gradient_sync()
    sgd_update(ddp.module, 1e-3)


def _naive_step(model, x, y):
    model.zero_grad()
    tiny.loss(model(x), y).backward()
    average_gradients_naive(model, dist.get_world_size())
    sgd_update(model, 1e-3)


def _timed(rank, world_size):
    x, y = tiny.batch(8, MODEL["dim"], seed=1 + rank)
    link = functools.partial(ddp_bench.paced_all_reduce, GBPS, ALPHA_S)
    ddp = BucketedDDP(_model(), bucket_cap_mb=1)
    variants = {"no communication": (functools.partial(_ddp_step, ddp, x, y),
                                     ddp_bench.without_all_reduce),
                "bucketed": (functools.partial(_ddp_step, ddp, x, y), link),
                "naive": (functools.partial(_naive_step, _model(), x, y), link)}
    return ddp_bench.time_steps(variants, steps=3, warmup=1), ddp_bench.bucket_plan(ddp)


def _modelled(plan):
    comm = [ALPHA_S + n / (GBPS * 1e9) for _, n in plan]      # K = 2: 2(K-1)/K = 1
    ready = [(MODEL["depth"] - j) * 2 * LAYER_S for j, _ in plan]
    return exposed_comm(ready, comm), sum(comm)


@pytest.fixture(scope="module")
def timed():
    runs = spawn(_timed, 2, backend="gloo", timeout=120)
    med = {n: statistics.median(ddp_bench.slowest_rank([t for t, _ in runs], n))
           for n in runs[0][0]}
    return med, runs[0][1]


def test_the_bucketed_step_meets_the_overlap_model_and_naive_ddp_does_not(timed):
    med, plan = timed
    assert len(plan) == 4
    exposed, t_comm = _modelled(plan)
    assert_near_overlap_model(med["bucketed"], med["no communication"], exposed, TOLERANCE_S)
    with pytest.raises(AssertionError):
        assert_near_overlap_model(med["naive"], med["no communication"], exposed, TOLERANCE_S)


def test_the_claim_uses_the_model_it_is_given(timed):
    med, plan = timed
    one_bucket = [(0, sum(n for _, n in plan))]                # nothing would hide
    exposed, _ = _modelled(one_bucket)
    with pytest.raises(AssertionError):
        assert_near_overlap_model(med["bucketed"], med["no communication"], exposed, TOLERANCE_S)


def test_exposed_comm():
    assert exposed_comm([1.0, 2.0, 3.0], [0.5, 0.5, 0.5]) == pytest.approx(0.5)
    assert exposed_comm([3.0, 3.0], [1.0, 2.0]) == pytest.approx(3.0)   # all at the end
    assert exposed_comm([0.0, 3.0], [4.0, 1.0]) == pytest.approx(2.0)   # the link queues


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
