"""Lecture 12 (expert parallelism): its shape, and its key measured claim with negative controls.

The claim (notebooks/12_expert_parallel.ipynb, section 3): around one forward and backward of the
expert-parallel layer, helpers.trace counts on every rank exactly the five all-to-alls of
`ep_bench.all_to_all_model` (the counts, the dispatch, the return, and their two mirrors), whose
bytes are computed from the single process's routing alone (`ep_bench.assert_all_to_all`). Bytes
do not depend on the machine's load, so the test holds on a busy machine. Made wrong on purpose,
each must fail it:
- a layer that forgets the capacity (run dropless) against the model of the capacity factor's
  routing, which drops assignments: more rows dispatched and returned;
- the right run against a model that counts float32 rows (half the bytes).

The pieces are imported from notebooks/course/expert_parallel.py, which is what the lecture shows
(tests/test_saved.py).
"""
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from course.expert_parallel import expert_mlp, make_router, moe_layer, moe_reference
from helpers import ep_bench, shape, tiny, trace
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "12_expert_parallel.ipynb"
K, PER, DIM, N, TOP_K, FACTOR = 2, 2, 8, 16, 2, 1.0      # float64: 8 bytes a number


def _modules(rank, world, dim, per):
    mine = [expert_mlp(dim, 1 + e) for e in range(rank * per, (rank + 1) * per)]
    return make_router(dim, world * per), expert_mlp(dim, 0), mine


def _traced(rank, world, x, factor):
    router, shared, mine = _modules(rank, world, x.shape[1], PER)
    n = len(x) // world
    xr = x[rank * n:(rank + 1) * n].clone().requires_grad_()
    with trace.calls() as log:
        y, _, _ = moe_layer(xr, router, mine, TOP_K, factor, shared)
        y.pow(2).sum().backward()
        for p in [*router.parameters(), *shared.parameters()]:
            dist.all_reduce(p.grad)
    return log.calls, y.detach(), xr.grad


def _reference(x, factor, world=K):
    router, shared = make_router(DIM, world * PER), expert_mlp(DIM, 0)
    experts = [expert_mlp(DIM, 1 + e) for e in range(world * PER)]
    x = x.clone().requires_grad_()
    y, kept = moe_reference(x, router, experts, TOP_K, factor, world, shared)
    y.pow(2).sum().backward()
    return y.detach(), x.grad, kept


@pytest.fixture(scope="module")
def runs():
    x, _ = tiny.batch(K * N, DIM, seed=1)
    return x, {f: spawn(_traced, K, args=(x, f), backend="gloo") for f in (FACTOR, None)}


def test_the_layer_equals_one_process_and_meets_the_all_to_all_model(runs):
    x, by_factor = runs
    for factor, res in by_factor.items():
        y, dx, kept = _reference(x, factor)
        torch.testing.assert_close(torch.cat([r[1] for r in res]), y, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.cat([r[2] for r in res]), dx, rtol=1e-12, atol=1e-12)
        for rank, (calls, _, _) in enumerate(res):
            ep_bench.assert_all_to_all(calls, ep_bench.all_to_all_model(kept, rank, DIM, 8))


def test_a_layer_that_forgets_the_capacity_fails_it(runs):
    x, by_factor = runs
    kept, routed = _reference(x, FACTOR)[2], _reference(x, None)[2]
    assert (routed - kept).sum() > 0, "the capacity factor must drop something here"
    for rank, (calls, _, _) in enumerate(by_factor[None]):
        with pytest.raises(AssertionError):
            ep_bench.assert_all_to_all(calls, ep_bench.all_to_all_model(kept, rank, DIM, 8))


def test_a_model_in_float32_fails_it(runs):
    x, by_factor = runs
    kept = _reference(x, FACTOR)[2]
    for rank, (calls, _, _) in enumerate(by_factor[FACTOR]):
        with pytest.raises(AssertionError):
            ep_bench.assert_all_to_all(calls, ep_bench.all_to_all_model(kept, rank, DIM, 4))


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0
