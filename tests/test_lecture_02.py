"""Lecture 02 (NCCL ring math): its shape, its key measured claims with negative controls, the
checks moved out of the notebook, and the cost model it added to helpers/cost.py.

The timed claim (notebooks/02_ring_math.ipynb, sections 4 and 6): on the H100 model (the paced link
charging each transfer an NVLink ring step of a DGX H100, alpha = 3.4 us and n/B at 370.8 GB/s (NCCL's own B), at a
time scale) the chunked ring broadcast and the ring all-reduce stay within 25% of their formulas,
(K-2+S)(alpha + N/(SB)) and 2(K-1)(alpha + N/(KB)), with the model's alpha and B: nothing of the
formula is measured. Two negative controls move the same bytes and give the same results on a
schedule made wrong on purpose, and must fail the claim: wrong algorithms, which fail whatever
the machine's ratio of alpha to N/B:
- a serialised ring all-reduce: each rank sends only after the rank before it has passed its
  chunk on (a token going round), so the K transfers of a step follow each other: about K times
  the formula;
- a store-and-forward chunked broadcast: a rank passes no chunk on before it holds them all, so
  the chunks do not pipeline: (K-1) S steps instead of K-2+S.

The published claim (section 6): the ring's published busbw plateau on 8 H100s is the model's ring
within 5 %, the model's B being NCCL's own NVLink figure (machinery.l02_published.assert_plateau);
a wrong machine, the A100's NVLink held against the H100's plateau, must fail it.

Section 6 tells a student how to turn the ring the other way (issue 33's trial); the recipe, applied
to the lecture's source, must give a ring that sends left and sums right, and half of it (the
neighbours swapped, the chunk numbers not) must sum wrong.

The pieces are imported from notebooks/course/ring_math.py, which is what the lecture shows
(tests/test_saved.py). The paced link takes time on a clock that needs no core, so these timings
hold on a loaded machine; each test takes a few seconds.
"""
import functools
import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from course import ring_math
from course.ring_math import (assert_near_model, exchange, ring_all_gather, ring_all_reduce,
                              ring_broadcast, ring_reduce_scatter)
from helpers import bench, cost, machines, standins, trace
from helpers.site import shape
from machinery import l02_published as published, l02_ring_figures as ring_figures
from helpers.spawn import spawn

SCALE = 1000                                      # 1 us of the H100 model: 1 ms here
H100 = machines.Scaled(machines.H100, time=SCALE, bytes=64)
GBPS, ALPHA_HERE = H100.link()
ALPHA, BW = machines.link(machines.H100)          # the model's: 3.4 us, 370.8 GB/s
NBYTES = 32 * 2**20                               # the model's N (sent here: N / 64)
LECTURE = Path(shape.NOTEBOOKS) / "02_ring_math.ipynb"


def _on_the_model(plan, ks):
    rows = bench.sweep(plan, world_sizes=ks, sizes=[NBYTES // 64], warmup=1, iters=5,
                       interleave=True, method="per-call", backend="gloo", progress=False)
    assert all(r["wrong"] == 0 for r in rows), "every schedule must deliver right: only time differs"
    return H100.rows(rows)


def serialised_ring_all_reduce(x):
    """The ring all-reduce's chunks, steps and sums, but one transfer at a time: in every step
    rank 0 sends first, and rank r > 0 sends only once it has received from rank r-1."""
    rank, k = dist.get_rank(), dist.get_world_size()
    chunks, nothing = list(torch.tensor_split(x, k)), x[:0]
    right, left = (rank + 1) % k, (rank - 1) % k
    incoming = torch.empty_like(chunks[0])
    for adding, lag in ((True, 1), (False, 0)):            # reduce-scatter, then all-gather
        for step in range(k - 1):
            send_c, recv_c = (rank - step - lag) % k, (rank - step - lag - 1) % k
            into = incoming[:len(chunks[recv_c])] if adding else chunks[recv_c]
            if rank == 0:
                exchange(chunks[send_c], right, nothing, left)
                exchange(nothing, right, into, left)
            else:
                exchange(nothing, right, into, left)       # the token: the left rank's chunk
                exchange(chunks[send_c], right, nothing, left)
            if adding:
                chunks[recv_c] += into


def store_and_forward_broadcast(x, root, n_chunks=1):
    """ring_broadcast's chunks, hops and result, but a rank passes no chunk on before it has
    received them all: (K-1) S steps, the chunks no longer overlapping on the links."""
    rank, k = dist.get_rank(), dist.get_world_size()
    p = (rank - root) % k
    chunks, nothing = [c for c in torch.tensor_split(x, n_chunks) if c.numel()], x[:0]
    right, left = (rank + 1) % k, (rank - 1) % k
    if p > 0:
        for chunk in chunks:
            exchange(nothing, right, chunk, left)
    if p < k - 1:
        for chunk in chunks:
            exchange(chunk, right, nothing, left)


def test_the_ring_meets_its_formula_on_the_model_and_a_serialised_ring_does_not():
    plan = {"ring": ("all_reduce", standins.paced(ring_all_reduce, GBPS, ALPHA_HERE)),
            "serialised": ("all_reduce", standins.paced(serialised_ring_all_reduce, GBPS,
                                                        ALPHA_HERE))}
    rows = _on_the_model(plan, [2, 3])

    def model(r):
        return cost.ring_all_reduce(NBYTES, r["world_size"], BW, ALPHA)

    right = [r for r in rows if r["collective"] == "ring"]
    wrong = [r for r in rows if r["collective"] == "serialised"]
    assert_near_model(right, model)
    with pytest.raises(AssertionError, match="off the formula"):
        assert_near_model(wrong, model)
    # the control fails for the reason it was built: each step's K transfers one after the other
    assert all(r["time_us"] * 1e-6 / model(r) > 0.6 * r["world_size"] for r in wrong)


def test_the_chunked_broadcast_meets_its_formula_and_a_store_and_forward_one_does_not():
    k, s = 3, 8
    plan = {"pipelined": ("broadcast", standins.paced(
                functools.partial(ring_broadcast, n_chunks=s), GBPS, ALPHA_HERE)),
            "store-and-forward": ("broadcast", standins.paced(
                functools.partial(store_and_forward_broadcast, n_chunks=s), GBPS, ALPHA_HERE))}
    rows = _on_the_model(plan, [k])
    model = lambda r: cost.chunked_ring_broadcast(NBYTES, k, s, BW, ALPHA)  # noqa: E731
    assert_near_model([r for r in rows if r["collective"] == "pipelined"], model)
    wrong = [r for r in rows if r["collective"] == "store-and-forward"]
    with pytest.raises(AssertionError, match="off the formula"):
        assert_near_model(wrong, model)
    # (K-1) S = 16 steps of N/(SB) against K-2+S = 9: about 16/9 of the formula
    assert all(r["time_us"] * 1e-6 / model(r) > 1.4 for r in wrong)


def test_the_published_ring_plateau_meets_the_model_and_a_wrong_machine_does_not():
    model, plateau = published.assert_plateau(machines.H100)
    assert 360 < model < 371 and all(360 <= p <= 375 for p in plateau)
    published.assert_plateau(machines.A100)                    # its own plateau, ~230 of ~240
    a100_links = machines.Machine(**{**machines.H100.__dict__, "nvlink_bw": machines.A100.nvlink_bw})
    with pytest.raises(AssertionError, match="published ring busbw"):
        published.assert_plateau(a100_links)


def test_the_claim_uses_the_model_it_is_given():
    """assert_near_model compares with the model passed, never with the rows themselves."""
    rows = [{"collective": "ring", "world_size": 4, "time_us": 1.2e6, "size": 1}]
    assert assert_near_model(rows, lambda r: 1.0)[("ring", 4)] == pytest.approx(0.2)
    with pytest.raises(AssertionError, match=r"\+50%"):
        assert_near_model(rows, lambda r: 0.8)


def _against_the_library(rank, k):
    """The lecture's ring reduce-scatter and all-gather beside the library's, where K divides the
    size (the library's take equal chunks)."""
    out = []
    for n in (k, 12 * k, 1000 * k):
        x = torch.randn(n, generator=torch.Generator().manual_seed(7919 * rank + n),
                        dtype=torch.float64)
        c = n // k
        mine_rs, mine_ag = x.clone(), x.clone()
        ring_reduce_scatter(list(mine_rs.tensor_split(k)))
        ring_all_gather(list(mine_ag.tensor_split(k)))   # every rank's own chunk, gathered
        lib_rs, lib_ag = torch.empty(c, dtype=x.dtype), torch.empty_like(x)
        dist.reduce_scatter_tensor(lib_rs, x.clone())
        dist.all_gather_into_tensor(lib_ag, x[rank * c:(rank + 1) * c].contiguous())
        out.append((mine_rs[rank * c:(rank + 1) * c], lib_rs, mine_ag, lib_ag))
    return out


@pytest.mark.parametrize("k", [2, 3, 4])
def test_the_ring_reduce_scatter_and_all_gather_agree_with_the_library(k):
    for per_rank in spawn(_against_the_library, k, backend="gloo"):
        for mine_rs, lib_rs, mine_ag, lib_ag in per_rank:
            torch.testing.assert_close(mine_rs, lib_rs, rtol=1e-12, atol=1e-12)  # sum order
            torch.testing.assert_close(mine_ag, lib_ag, rtol=0, atol=0)          # copies


NEIGHBOURS = "right, left = (rank + 1) % k, (rank - 1) % k"


def _turned(chunk_signs=True):
    """The lecture's ring reduce-scatter and all-gather turned the other way as section 6 says
    (the student's trial of issue 33): `right` and `left` swapped and, with chunk_signs, every
    minus in the chunk numbers a plus. Rebuilt from their source, so the recipe follows the code."""
    src = "".join(inspect.getsource(f) for f in (ring_reduce_scatter, ring_all_gather))
    assert src.count(NEIGHBOURS) == 2, "the lecture's ring no longer names right and left so"
    src = src.replace(NEIGHBOURS, "right, left = (rank - 1) % k, (rank + 1) % k")
    if chunk_signs:
        src, n = re.subn(r"\(rank - step[ \-0-9]*\)", lambda m: m[0].replace("-", "+"), src)
        assert n == 4, f"the recipe expects 4 chunk numbers (rank - step ...), found {n}"
    space = dict(vars(ring_math))
    exec(compile(src, "turned", "exec"), space)
    return space["ring_reduce_scatter"], space["ring_all_gather"]


def _turned_all_reduce(rank, k, sizes, chunk_signs):
    reduce_scatter, all_gather = _turned(chunk_signs)
    out = []
    for n in sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(7919 * rank + n),
                        dtype=torch.float64)
        with trace.calls() as log:
            chunks = list(x.tensor_split(k))
            reduce_scatter(chunks)
            all_gather(chunks)
        out.append((x, {c.peer for c in log.select("send")}))
    return out


def _plain_sum(k, n):
    return sum(torch.randn(n, generator=torch.Generator().manual_seed(7919 * r + n),
                           dtype=torch.float64) for r in range(k))


@pytest.mark.parametrize("k", [3, 4])
def test_the_ring_turned_the_other_way_as_the_lecture_says_still_sums_and_half_turned_does_not(k):
    """Section 6's recipe gives a ring that sends to the left and sums right, on sizes K does not
    divide too; the negative control swaps only `right` and `left`: on sizes K divides, where every
    send still finds its receive, its sums are wrong (on the others it hangs, as the lecture says)."""
    sizes = [1, 5, 1001, 12 * k]
    for rank, per_n in enumerate(spawn(_turned_all_reduce, k, args=(sizes, True), backend="gloo")):
        for n, (x, peers) in zip(sizes, per_n):
            torch.testing.assert_close(x, _plain_sum(k, n), rtol=1e-12, atol=1e-12)
            assert peers == {(rank - 1) % k} or (n < k and peers <= {(rank - 1) % k}), \
                f"rank {rank} sent to ranks {peers}, not to its left only"
    half = spawn(_turned_all_reduce, k, args=([12 * k], False), backend="gloo", timeout=60)
    assert any(not torch.allclose(x, _plain_sum(k, 12 * k)) for [(x, _)] in half)


def test_the_pipelined_tree_model():
    f = cost.pipelined_tree_all_reduce
    n, bw = 64 * 2**20, 3e9
    assert f(n, 1, bw, 1e-4) == 0.0
    assert f(n, 2, bw, 0.0) == pytest.approx(n / bw)             # one edge: N each way
    for k in (3, 8, 1000):
        assert f(n, k, bw, 0.0) == pytest.approx(2 * n / bw)     # the busiest rank: 2N
    for k, alpha in ((8, 1e-4), (64, 1e-5), (1024, 9e-5)):      # the best S, by brute force
        hops = 2 * int(np.floor(np.log2(k))) - 1
        brute = min((hops + s) * (alpha + 2 * n / (s * bw)) for s in np.arange(1, 1e5, 0.25))
        assert f(n, k, bw, alpha) == pytest.approx(brute, rel=1e-6)
    # latency grows with log2 K: at scale it beats the ring, whose latency grows with K ...
    assert f(n, 1024, bw, 9e-5) < cost.ring_all_reduce(n, 1024, bw, 9e-5) / 3
    # ... and on few ranks with large messages the ring's smaller bandwidth term wins
    assert cost.ring_all_reduce(n, 8, bw, 1e-5) < f(n, 8, bw, 1e-5)
    # always at least as good as the unpipelined tree, which sends whole messages
    for k in (2, 5, 8, 64):
        for size in (8 * 2**10, n):
            assert f(size, k, bw, 1e-5) <= cost.tree_all_reduce(size, k, bw, 1e-5)


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0
