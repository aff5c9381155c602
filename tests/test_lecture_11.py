"""Lecture 11 (sequence and context parallelism): its shape, and its key claim with negative controls.

The claim (notebooks/11_sequence_context_parallel.ipynb, section 4): the matmul flops that
FlopCounterMode counts around each rank's ring attention, forward and backward, causal, equal the
layout's model: the chunk pairs (i, j), j <= i, its queries meet, times one pair's flops,
14 b a n^2 d (`cp_bench.assert_work`, tolerance 0: both are counts, so it holds under load).
Runs or models made wrong on purpose must fail it:
- the contiguous layout's run against the zig-zag model (an unbalanced ring claimed balanced);
- the right runs against a model that forgets the diagonal pairs (j < i only);
- the right runs against a model off by a factor of two in a pair's flops;
- a ring that is right but computes the future blocks (j > i) and masks them away: its counted
  forward flops exceed the model's.
The ring's result is also checked against tiny.attention (float64), so the counted run is a right one.

The ring is group-aware (`group`, default the world): on 4 ranks, two rings of 2 on the lines
{0, 2} and {1, 3}, each over its own sequence, equal attention forward and backward, and every
send and receive is on the rank's line's group. The negative control: the same data with the rings
run over {0, 1} and {2, 3} (the wrong group) is not attention.

The pieces are imported from notebooks/course/sequence_context_parallel.py, which is what the
lecture shows (tests/test_saved.py).
"""
import math
from pathlib import Path

import pytest
import torch

from course.sequence_context_parallel import (contiguous, merge, ring_attention, ring_pass,
                                              scores, zigzag)
from helpers import tiny, trace
from machinery import l11_sequence_context_parallel as cp_bench
from helpers.site import shape
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "11_sequence_context_parallel.ipynb"
K, B, A, N, D = 3, 1, 2, 4, 8                  # ranks, batch, heads, tokens per chunk, head size
PER_PAIR = 14 * B * A * N * N * D
LAYOUTS = {"contiguous": contiguous, "zigzag": zigzag}


def _data():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(B, A, 2 * K * N, D, generator=gen, dtype=torch.float64) for _ in range(4)]


def _take(x, mine):
    return torch.cat([x[..., i * N:(i + 1) * N, :] for i in mine], dim=-2)


def _ring(rank, world, layout):
    chunks = LAYOUTS[layout](world)
    q, k, v, dout = _data()
    q, k, v = (_take(t, chunks[rank]).requires_grad_() for t in (q, k, v))
    with cp_bench.counted() as fwd:
        out = ring_attention(q, k, v, chunks)
    with cp_bench.counted() as bwd:
        out.backward(_take(dout, chunks[rank]))
    return out.detach(), q.grad, fwd["flops"] + bwd["flops"], fwd["steps"]


def _wasteful_ring(rank, world):
    """The forward ring computing every block; a future block (j > i) is merged with weight 0."""
    chunks = zigzag(world)
    q, k, v, _ = (_take(t, chunks[rank]) for t in _data())
    qs = q.chunk(2, dim=-2)
    out = [torch.zeros_like(x) for x in qs]
    lse = [torch.full_like(x[..., :1], float("-inf")) for x in qs]
    kv = torch.stack([k, v])
    with cp_bench.counted() as fwd:
        for t in range(world):
            ks, vs = kv[0].chunk(2, dim=-2), kv[1].chunk(2, dim=-2)
            for a, i in enumerate(chunks[rank]):
                for b, j in enumerate(chunks[(rank - t) % world]):
                    sc = scores(qs[a], ks[b], i, j)           # unmasked when j > i
                    l = sc.logsumexp(dim=-1, keepdim=True)
                    part = torch.exp(sc - l) @ vs[b]
                    if j > i:                                 # masked: contributes nothing
                        l = torch.full_like(l, float("-inf"))
                    out[a], lse[a] = merge(out[a], lse[a], part, l)
            if t < world - 1:
                kv, works = ring_pass(kv)
                [w.wait() for w in works]
    return torch.cat(out, dim=-2), fwd["flops"], fwd["steps"]


def _pairs(chunks, diagonal=True):
    return [sum(i + 1 if diagonal else i for i in mine) for mine in chunks]


@pytest.fixture(scope="module")
def runs():
    return {name: spawn(_ring, K, args=(name,), backend="gloo") for name in LAYOUTS}


def test_the_ring_is_attention(runs):
    q, k, v, dout = _data()
    q.requires_grad_()
    ref = tiny.attention(q, k, v)
    ref.backward(dout)
    for name, layout in LAYOUTS.items():
        for rank, (out, dq, _, _) in enumerate(runs[name]):
            mine = layout(K)[rank]
            torch.testing.assert_close(out, _take(ref.detach(), mine), rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(dq, _take(q.grad, mine), rtol=1e-12, atol=1e-12)


def test_both_layouts_meet_the_model(runs):
    for name, layout in LAYOUTS.items():
        cp_bench.assert_work([r[2] for r in runs[name]], _pairs(layout(K)), PER_PAIR, name)
    assert cp_bench.imbalance([r[2] for r in runs["zigzag"]]) == 1


def test_the_contiguous_run_fails_the_balanced_model(runs):
    with pytest.raises(AssertionError):
        cp_bench.assert_work([r[2] for r in runs["contiguous"]], _pairs(zigzag(K)), PER_PAIR,
                             "contiguous as zig-zag")


def test_a_model_without_the_diagonal_fails_it(runs):
    for name, layout in LAYOUTS.items():
        with pytest.raises(AssertionError):
            cp_bench.assert_work([r[2] for r in runs[name]], _pairs(layout(K), False),
                                 PER_PAIR, name)


def test_a_model_off_by_two_fails_it(runs):
    with pytest.raises(AssertionError):
        cp_bench.assert_work([r[2] for r in runs["zigzag"]], _pairs(zigzag(K)), 2 * PER_PAIR,
                             "zigzag")


def test_a_ring_computing_the_future_blocks_fails_it():
    """Right result, wasted work: every rank computes all 4K pairs, the model counts 2K+1."""
    q, k, v, _ = _data()
    ref = tiny.attention(q, k, v)
    runs = spawn(_wasteful_ring, K, backend="gloo")
    for rank, (out, _, _) in enumerate(runs):
        torch.testing.assert_close(out, _take(ref, zigzag(K)[rank]), rtol=1e-12, atol=1e-12)
    assert [f for _, f, _ in runs] == [4 * K * FORWARD_PAIR] * K   # what it did
    with pytest.raises(AssertionError):
        cp_bench.assert_work([f for _, f, _ in runs], _pairs(zigzag(K)), FORWARD_PAIR,
                             "zigzag, future blocks computed")
    recorded = [[f / FORWARD_PAIR for f in steps] for _, _, steps in runs]   # the picture differs
    assert recorded == [[4] * K] * K != cp_bench.per_step(_block_steps(zigzag(K)), K)


FORWARD_PAIR = 4 * B * A * N * N * D


def _block_steps(chunks):
    """The specification lecture 11 draws: query chunk i meets key chunk j <= i on i's rank at
    step (owner(i) - owner(j)) mod K."""
    owner = {c: r for r, mine in enumerate(chunks) for c in mine}
    return {(i, j): (owner[i], (owner[i] - owner[j]) % len(chunks)) for i in owner for j in owner
            if j <= i}


def test_each_step_recorded_is_the_specification(runs):
    """The forward's flops read at each pass's arrival, in blocks, equal the blocks the
    specification gives each rank at each step; each layout's against the other's fails."""
    for name, layout in LAYOUTS.items():
        recorded = [[f / FORWARD_PAIR for f in r[3]] for r in runs[name]]
        assert recorded == cp_bench.per_step(_block_steps(layout(K)), K), name
        other = zigzag if layout is contiguous else contiguous
        assert recorded != cp_bench.per_step(_block_steps(other(K)), K), name


LINES, WRONG = [[0, 2], [1, 3]], [[0, 1], [2, 3]]   # rings of 2 on 4 ranks: right, wrong group


def _line_data(line):
    """q, k, v, dout of the sequence of line `line`: 2 chunks for each of its 2 ranks."""
    gen = torch.Generator().manual_seed(10 + line)
    return [torch.randn(B, A, 4 * N, D, generator=gen, dtype=torch.float64) for _ in range(4)]


def _ring_in_group(rank, world, data_lines, ring_lines):
    """This rank's chunks of its data line's sequence, the ring run over its ring line's group."""
    import torch.distributed as dist

    group, _ = dist.new_subgroups_by_enumeration(ring_lines)
    line = next(i for i, ranks in enumerate(data_lines) if rank in ranks)
    chunks = zigzag(2)
    mine = chunks[data_lines[line].index(rank)]
    q, k, v, dout = (_take(t, mine) for t in _line_data(line))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with trace.calls() as log:
        out = ring_attention(q, k, v, chunks, group)
        out.backward(dout)
    ranks = {c.ranks for c in log.calls}
    return out.detach(), [t.grad for t in (q, k, v)], ranks, {c.kind for c in log.calls}


def _attention_of_line(rank, data_lines):
    line = next(i for i, ranks in enumerate(data_lines) if rank in ranks)
    mine = zigzag(2)[data_lines[line].index(rank)]
    q, k, v, dout = _line_data(line)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = tiny.attention(q, k, v)
    out.backward(dout)
    return [_take(t, mine) for t in (out.detach(), q.grad, k.grad, v.grad)]


def test_the_ring_runs_inside_a_group():
    for rank, (out, grads, ranks, kinds) in enumerate(
            spawn(_ring_in_group, 4, args=(LINES, LINES), backend="gloo")):
        torch.testing.assert_close([out, *grads], _attention_of_line(rank, LINES),
                                   rtol=1e-12, atol=1e-12)
        assert ranks == {tuple(next(l for l in LINES if rank in l))}   # its line's group only
        assert kinds == {"send", "recv"}


def test_a_ring_over_the_wrong_group_is_not_attention():
    runs = spawn(_ring_in_group, 4, args=(LINES, WRONG), backend="gloo")
    for rank, (out, grads, ranks, _) in enumerate(runs):
        assert ranks == {tuple(next(l for l in WRONG if rank in l))}
    with pytest.raises(AssertionError):
        for rank, (out, grads, _, _) in enumerate(runs):
            torch.testing.assert_close([out, *grads], _attention_of_line(rank, LINES),
                                       rtol=1e-12, atol=1e-12)


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0


def test_the_merge_is_stable_where_a_naive_one_overflows():
    """merge uses only exponentials of differences: with log-sum-exps near 1000 (exp overflows
    float64 at 710) it is finite and exact, where the textbook weighted mean is nan."""
    from course.sequence_context_parallel import merge

    out1, out2 = torch.full((2, 3), 1.0, dtype=torch.float64), torch.full((2, 3), 3.0, dtype=torch.float64)
    lse1, lse2 = torch.full((2, 1), 1000.0, dtype=torch.float64), torch.full((2, 1), 1000.0 + math.log(3), dtype=torch.float64)
    out, lse = merge(out1, lse1, out2, lse2)   # lse near 1000 carries ~1000 u: rtol 1e-12
    torch.testing.assert_close(out, torch.full((2, 3), 2.5, dtype=torch.float64), rtol=1e-12, atol=0)
    torch.testing.assert_close(lse, lse1 + math.log(4), rtol=1e-15, atol=0)
    naive = (lse1.exp() * out1 + lse2.exp() * out2) / (lse1.exp() + lse2.exp())
    assert torch.isnan(naive).all()                     # the negative control: inf / inf


def _kv_repeated(q, k, v, chunks):
    """GQA done the naive way: each key/value head copied for its queries, then the ring."""
    from course.sequence_context_parallel import ring_forward
    return ring_forward(q, k.expand_as(q).contiguous(), v.expand_as(q).contiguous(), chunks)


def _groups_transposed(q, k, v, chunks):
    """A wrong grouping: query heads taken across the key/value heads instead of within them."""
    from course.sequence_context_parallel import ring_forward
    regrouped = q.transpose(1, 2).reshape(q.shape)
    return ring_forward(regrouped, k, v, chunks)


def test_gqa_runs_the_ring_as_it_is_and_a_ring_of_copied_heads_sends_more():
    """Section 5: the lecture's ring_forward on grouped-query attention by broadcasting equals
    torch's enable_gqa attention and sends 2(K-1) b (s/K) a_kv d w bytes; copying the key/value
    heads before the ring is also attention but sends a / a_kv times that; a wrong grouping of
    the query heads is not attention."""
    from course.sequence_context_parallel import ring_forward
    k_, a, a_kv, n = 2, 4, 2, 2
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, a, 2 * k_ * n, D, generator=gen, dtype=torch.float64) for _ in range(3))
    qkv = (q.view(1, a_kv, a // a_kv, -1, D), k[:, :a_kv, None], v[:, :a_kv, None])   # as the lecture
    formula = 2 * (k_ - 1) * 1 * 2 * n * a_kv * D * 8
    assert cp_bench.gqa_run(ring_forward, zigzag(k_), qkv, n, "gloo") == [formula] * k_
    copied = cp_bench.gqa_run(_kv_repeated, zigzag(k_), qkv, n, "gloo")
    assert copied == [formula * a // a_kv] * k_
    with pytest.raises(AssertionError, match="GQA with 2 key/value heads"):
        cp_bench.gqa_run(_groups_transposed, zigzag(k_), qkv, n, "gloo")
