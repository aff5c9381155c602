"""Lecture 07 (tensor parallelism): its shape, and its key measured claim with negative controls.

The claim (notebooks/07_tensor_parallel.ipynb, section 5): the collectives that helpers.trace
counts around a Megatron block's forward and backward equal `megatron_traffic` exactly (one
all-reduce of tokens x dim values forward, one backward, per block; `assert_traffic`). Counts do
not depend on the machine's load, so the test holds on a busy machine. Three runs or models made
wrong on purpose must fail it:
- a block with one f too many (its input's gradient all-reduced twice: wrong gradients, and one
  all-reduce more in backward);
- the reading's scheme (CS336: every layer column-split, its output all-gathered);
- the right run against a model off by a factor of two in the bytes.

Section 6's claim on the H100 model (`tp_bench.assert_added`): on device-like compute (a d = 8192
block on 4096 tokens) and lecture 02's ring over the model's NVLink, what the all-reduces add to a
step at K = 4 (the step's median less the least round on an unpaced link, tp_bench.added) equals
the model's two ring all-reduces within its tolerance (the rounds' spread, the floor's, and the
floor beyond the step without communication). Two negative controls fail it: a wrong algorithm
(a naive all-reduce through rank 0, 2(K-1) S/B, on the same link) and a wrong machine (the right
run against the model of one GPU a node, its 50 GB/s NIC). The stand-ins sleep (no core), so it
holds under load.

The pieces are imported from notebooks/course/tensor_parallel.py, which is what the lecture shows
(tests/test_saved.py).
"""
import functools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course.tensor_parallel import (ParallelBlock, assert_traffic, f, megatron_traffic)
from helpers import cost, machines, standins, tiny, trace
from helpers.site import shape
from machinery import l05_ddp as ddp_bench
from machinery import l07_tensor_parallel as tp_bench
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "07_tensor_parallel.ipynb"
DIM, HIDDEN, TOKENS = 16, 64, 6                      # float64: 8 bytes a value


class _OneFTooMany(ParallelBlock):
    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(f(x))))    # fc1 has its own f already


def _gathered(x, block, rank, K):
    for layer, act in ((block.fc1, F.gelu), (block.fc2, lambda t: t)):
        w, b = layer.weight.tensor_split(K)[rank], layer.bias.tensor_split(K)[rank]
        parts = [x.new_empty(len(x), len(b)) for _ in range(K)]
        dist.all_gather(parts, act(F.linear(x, w, b)))
        x = torch.cat(parts, dim=1)
    return x


def _traced(rank, K, variant):
    block = tiny.model(DIM, HIDDEN, 1, seed=0)[0]
    x = tiny.batch(TOKENS, DIM, seed=1)[0].requires_grad_()
    with trace.calls() as log:
        log.phase = "forward"
        if variant == "gathered":
            with torch.no_grad():
                y = x + _gathered(x, block, rank, K)
            return log.rows(by=("phase", "kind")), None
        blk = (ParallelBlock if variant == "megatron" else _OneFTooMany)(block, rank, K)
        y = blk(x)
        log.phase = "backward"
        y.pow(2).sum().backward()
    return log.rows(by=("phase", "kind")), x.grad


@pytest.fixture(scope="module")
def runs():
    return {v: spawn(_traced, 2, args=(v,), backend="gloo")
            for v in ("megatron", "one f too many", "gathered")}


def test_the_megatron_block_meets_the_traffic_model(runs):
    model = megatron_traffic(1, TOKENS, DIM, 8)
    block = tiny.model(DIM, HIDDEN, 1, seed=0)[0]
    x = tiny.batch(TOKENS, DIM, seed=1)[0].requires_grad_()
    block(x).pow(2).sum().backward()
    for rows, dx in runs["megatron"]:
        assert_traffic(rows, model)
        torch.testing.assert_close(dx, x.grad, rtol=1e-12, atol=1e-12)


def test_a_block_with_one_f_too_many_fails_it(runs):
    for rows, _ in runs["one f too many"]:
        with pytest.raises(AssertionError):
            assert_traffic(rows, megatron_traffic(1, TOKENS, DIM, 8))


def test_the_readings_scheme_fails_it(runs):
    for rows, _ in runs["gathered"]:
        assert_traffic(rows, {("forward", "all_gather"): (2, TOKENS * (HIDDEN + DIM) * 8)})
        with pytest.raises(AssertionError):
            assert_traffic(rows, megatron_traffic(1, TOKENS, DIM, 8))


def test_a_model_off_by_two_fails_it(runs):
    for rows, _ in runs["megatron"]:
        with pytest.raises(AssertionError):
            assert_traffic(rows, megatron_traffic(1, TOKENS, DIM, 16))


# The lecture's H100 model (section 6): a d = 8192 block on 4096 tokens stood for by one of width
# 96, hidden 384, on 256 tokens of float32.
S = 256 * 96 * 4
H100 = machines.Scaled(machines.H100, time=60, bytes=8192 * 4096 * 2 / S)
F_S = H100.compute(8 * 8192**2 * 4096)


def _rings(K, bw, alpha):
    return 2 * H100.wall(cost.ring_all_reduce(S * H100.bytes, K, bw, alpha))


def _naive_all_reduce(x):
    """A wrong algorithm: every rank sends x to rank 0, which sums and sends it back."""
    rank, k = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = torch.empty_like(x)
        for src in range(1, k):
            dist.recv(incoming, src)
            x += incoming
        for dst in range(1, k):
            dist.send(x, dst)
    else:
        dist.send(x, 0)
        dist.recv(x, 0)


def _standin(rank, K, steps):
    blk = ParallelBlock(tiny.Block(96, 384).float(), rank, K)
    blk.fc1, blk.fc2 = (standins.DeviceLike(m, F_S / K) for m in (blk.fc1, blk.fc2))
    x = torch.randn(256, 96, requires_grad=True)
    step = lambda: blk(x).sum().backward()
    naive = functools.partial(ddp_bench.on_model, H100, algorithm=_naive_all_reduce)
    return {**tp_bench.model_steps(step, H100, steps, warmup=1),
            **ddp_bench.time_steps({"naive": (step, naive)}, steps, warmup=1)}


@pytest.fixture(scope="module")
def added_at_4():
    res = spawn(_standin, 4, args=(5,), backend="gloo")
    return {n: tp_bench.added(res, n) for n in ("on the model", "naive")}


def test_the_step_on_the_model_meets_two_rings(added_at_4):
    nvlink = machines.ring_bw(machines.H100), machines.link(machines.H100)[0]
    tp_bench.assert_added(added_at_4["on the model"], _rings(4, *nvlink), 4)


def test_a_naive_all_reduce_fails_it(added_at_4):
    nvlink = machines.ring_bw(machines.H100), machines.link(machines.H100)[0]
    with pytest.raises(AssertionError):
        tp_bench.assert_added(added_at_4["naive"], _rings(4, *nvlink), 4)


def test_the_model_of_one_gpu_a_node_fails_it(added_at_4):
    net = machines.H100.nic_bw, machines.RING_STEP["net"]["Simple"]
    with pytest.raises(AssertionError):
        tp_bench.assert_added(added_at_4["on the model"], _rings(4, *net), 4)


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0
