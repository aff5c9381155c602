"""Lecture 12 (expert parallelism): its shape, and its key measured claim with negative controls.

The key claim (notebooks/12_expert_parallel.ipynb, section 3): on every rank, the dispatch
all-to-all's split lists, recorded by wrapping the layer (`ep_bench.splits`), are row and column
of the K x K split matrix computed from the single process's routing (`ep_bench.split_model`,
`ep_bench.assert_split_matrix`). A layer whose router's columns are rolled by one rank's experts
sends every rank the same number of rows (and bytes) to the wrong ranks: it must fail it.

The bytes (section 3 too): around one forward and backward of the
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

from course.expert_parallel import (balance, balanced_top, expert_mlp, make_router, moe_layer,
                                     moe_reference)
from helpers import tiny, trace
from machinery import l12_expert_parallel as ep_bench
from helpers.site import shape
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "12_expert_parallel.ipynb"
K, PER, DIM, N, TOP_K, FACTOR = 2, 2, 8, 16, 2, 1.0      # float64: 8 bytes a number


def _modules(rank, world, dim, per):
    mine = [expert_mlp(dim, 1 + e) for e in range(rank * per, (rank + 1) * per)]
    return make_router(dim, world * per), expert_mlp(dim, 0), mine


def _traced(rank, world, x, factor, roll=0):
    router, shared, mine = _modules(rank, world, x.shape[1], PER)
    n = len(x) // world
    xr = x[rank * n:(rank + 1) * n].clone().requires_grad_()
    scores = (lambda h: router(h).roll(roll, dims=-1)) if roll else router
    with trace.calls() as log, ep_bench.splits() as split_log:
        y, _, _ = moe_layer(xr, scores, mine, TOP_K, factor, shared)
        y.pow(2).sum().backward()
        for p in [*router.parameters(), *shared.parameters()]:
            dist.all_reduce(p.grad)
    return log.calls, y.detach(), xr.grad, split_log


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


def test_the_split_matrix_is_the_routings(runs):
    x, by_factor = runs
    for factor, res in by_factor.items():
        kept = _reference(x, factor)[2]
        ep_bench.assert_split_matrix([r[3] for r in res], ep_bench.split_model(kept))


def test_a_layer_that_sends_rows_to_the_wrong_ranks_fails_it():
    x, _ = tiny.batch(K * N, DIM, seed=1)
    res = spawn(_traced, K, args=(x, None, PER), backend="gloo")    # experts off by one rank
    kept = _reference(x, None)[2]
    for rank, r in enumerate(res):       # the same rows and bytes leave every rank ...
        ep_bench.assert_all_to_all(r[0][:2], ep_bench.all_to_all_model(kept, rank, DIM, 8)[:2])
    with pytest.raises(AssertionError):  # ... to the wrong ranks
        ep_bench.assert_split_matrix([r[3] for r in res], ep_bench.split_model(kept))


def _router_grad(k, normalise):
    x, _ = tiny.batch(N, DIM, seed=2)
    router = make_router(DIM, 4)
    experts = [expert_mlp(DIM, 1 + e) for e in range(4)]
    if normalise:                        # what Switch is not: gates renormalised, all 1 at k = 1
        probs = torch.softmax(router(x), -1)
        top_p, top = probs.topk(k, -1)
        gates = top_p / top_p.sum(-1, keepdim=True)
        y = x + sum(gates[:, j:j + 1] * torch.stack([experts[int(e)](x[i])
                    for i, e in enumerate(top[:, j])]) for j in range(k))
    else:
        y, _ = moe_reference(x, router, experts, k, None, 1)
    y.pow(2).sum().backward()
    return router.weight.grad.abs().max().item()


def test_top1_router_gets_a_gradient_and_renormalised_gates_would_give_none():
    assert _router_grad(1, normalise=False) > 1e-6
    assert _router_grad(1, normalise=True) < 1e-12      # rounding only


def test_the_layer_equals_one_process_and_meets_the_all_to_all_model(runs):
    x, by_factor = runs
    for factor, res in by_factor.items():
        y, dx, kept = _reference(x, factor)
        torch.testing.assert_close(torch.cat([r[1] for r in res]), y, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(torch.cat([r[2] for r in res]), dx, rtol=1e-12, atol=1e-12)
        for rank, (calls, _, _, _) in enumerate(res):
            ep_bench.assert_all_to_all(calls, ep_bench.all_to_all_model(kept, rank, DIM, 8))


def test_a_layer_that_forgets_the_capacity_fails_it(runs):
    x, by_factor = runs
    kept, routed = _reference(x, FACTOR)[2], _reference(x, None)[2]
    assert (routed - kept).sum() > 0, "the capacity factor must drop something here"
    for rank, (calls, _, _, _) in enumerate(by_factor[None]):
        with pytest.raises(AssertionError):
            ep_bench.assert_all_to_all(calls, ep_bench.all_to_all_model(kept, rank, DIM, 8))


def test_a_model_in_float32_fails_it(runs):
    x, by_factor = runs
    kept = _reference(x, FACTOR)[2]
    for rank, (calls, _, _, _) in enumerate(by_factor[FACTOR]):
        with pytest.raises(AssertionError):
            ep_bench.assert_all_to_all(calls, ep_bench.all_to_all_model(kept, rank, DIM, 4))


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0


def test_the_bias_evens_the_load_and_moves_no_gate_and_no_update_leaves_it():
    """Section 4's DeepSeek-V3 balancing: the busiest expert's load over the mean falls over 40
    updates at the lecture's sizes (K = 2 to 4, SMOKE's 16 tokens a rank too); the gates stay the
    probabilities' of the chosen experts; the control, the bias moved the wrong way (towards
    the busy experts), must fail the claim."""
    for k_ranks in (2, 3, 4):
        for n in (16, 64):
            x, _ = tiny.batch(k_ranks * n, 32, seed=1)
            probs = torch.softmax(make_router(32, 2 * k_ranks)(x), -1).detach()
            ratio = balance(probs, 2, gamma=1e-3, updates=40)
            assert ratio[-1] < ratio[0], (k_ranks, n, ratio)
            wrong = balance(probs, 2, gamma=-1e-3, updates=40)
            assert not wrong[-1] < wrong[0], (k_ranks, n, wrong)
    bias = torch.tensor([0.0, 0.0, 1.0, 0.0])                 # expert 2 always chosen
    probs = torch.tensor([[0.4, 0.3, 0.1, 0.2]], dtype=torch.float64)
    top, gates = balanced_top(probs, bias, 2)
    assert top.tolist() == [[2, 0]]
    torch.testing.assert_close(gates, torch.tensor([[0.2, 0.8]], dtype=torch.float64))
