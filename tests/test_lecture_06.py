"""Lecture 06 (ZeRO): its key measured claim with negative controls, the peak of a ZeRO-3 step,
the bytes instruments and its shape (its wrappers against torch's: tests/test_zero_wrappers.py).

- The key claim (section 5, course.zero.assert_forward_model), on the H100 model (each unit a
  d = 8192 layer on 4096 tokens, every all-gather lecture 02's ring over the model's NVLink on a
  comm stream, compute beside it slowed by the contention average): what the gathers add to a
  forward (the forward's median less the least round of the same forward on an unpaced link,
  timing.above_floor) is L g in turns and, prefetched, g plus the contention of the L-1 gathers
  hidden behind a layer, each within the rounds' spread, the floor's and the floor beyond its
  model (how much of it a paced round keeps is not known). Two negative controls fail it: a wrong algorithm (a serialised schedule
  passed as the prefetched one) and a wrong machine (the model of one GPU a node, whose gathers
  outlast its layers). The stand-ins take time without a core, so this holds on a loaded machine.
- A ZeRO-3 step's peak (section 4, zero_bench.assert_zero3_peak: the lecture checks its float64
  step with the same bound) is what a rank holds plus one or two gathered units and the
  gradient's buffers, not all layers; a unit that never frees its gathered parameters fails it.
"""
import contextlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course.zero import ShardedUnit, assert_forward_model, forward_model, prefetch_forward
from helpers import cost, machines, standins, timing, tiny
from helpers.site import shape
from machinery import l06_zero as zero_bench
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "06_zero.ipynb"


LAYER_BYTES = 12 * 8192**2 * 2                                   # a d = 8192 layer, bf16
H100 = machines.Scaled(machines.H100, time=10, bytes=LAYER_BYTES / (72 * 4))  # Linear(8, 8)
ALPHA, BW = machines.link(machines.H100)
GATHER_S = H100.wall(cost.ring_all_gather(LAYER_BYTES, 2, BW, ALPHA))
COMPUTE_S = H100.compute(2 * 12 * 8192**2 * 4096)
SHARE = machines.H100.contention[0]


def _forward_times(rank, n, prefetch, rounds=5):
    layers = [standins.DeviceLike(nn.Linear(8, 8), COMPUTE_S) for _ in range(4)]
    model = nn.Sequential(*[ShardedUnit(layer) for layer in layers])
    if prefetch:
        prefetch_forward(list(model))
    return zero_bench.timed_forwards(model, torch.ones(2, 8), layers, H100, SHARE, rounds)[0]


@pytest.fixture(scope="module")
def added():
    out = {}
    for p in (False, True):
        res = spawn(_forward_times, 2, args=(p,), backend="gloo")
        slowest = lambda paced: [max(ts) for ts in zip(*(r[paced] for r in res))]  # noqa: E731
        bare = forward_model(0.0, COMPUTE_S, 4, SHARE)[p]      # the floor's model
        out[p] = timing.above_floor(slowest(True), slowest(False), bare)
    return out


def _check(added, gather_s, runs={False: False, True: True}):
    """The lecture's claim; `runs` says which run stands for which schedule."""
    assert_forward_model({p: added[r]["median"] for p, r in runs.items()}, gather_s,
                         COMPUTE_S, 4, SHARE,
                         {p: added[r]["tolerance"] for p, r in runs.items()})


def test_each_schedule_meets_its_model(added):
    _check(added, GATHER_S)


def test_the_forward_model():
    assert forward_model(1.0, 2.0, 4) == (12.0, 1 + 3 * 2 + 2)
    assert forward_model(1.0, 2.0, 4, share=0.5) == pytest.approx((12.0, 1 + 3 * (2 + 1 / 3) + 2))
    assert forward_model(3.0, 1.0, 4) == (16.0, 3 + 3 * 3 + 1)          # gathers outlast layers


def test_a_serialised_prefetch_fails_it(added):
    with pytest.raises(AssertionError):
        _check(added, GATHER_S, {False: False, True: False})


def test_the_model_of_one_gpu_a_node_fails_it(added):
    net = machines.H100.nic_bw, machines.RING_STEP["net"]["Simple"]
    with pytest.raises(AssertionError):
        _check(added, H100.wall(cost.ring_all_gather(LAYER_BYTES, 2, *net)))


def _gathered(rank, k):
    from helpers import comm_stream
    
    out = torch.empty(2 * k)
    with comm_stream.paced(None, 1e-3, 0.01, all_gather=zero_bench.ring_all_gather_single) as stream:
        work = dist.all_gather_single(out, torch.full((2,), rank + 1.0), async_op=True)
        work.wait()
    return out, stream.calls


def test_the_comm_stream_runs_an_all_gather_too():
    """all_gather_single on the comm stream is the given algorithm (lecture 02's ring all-gather,
    K-1 paced steps of the input's bytes): every rank gets every slice, in rank order."""
    for out, calls in spawn(_gathered, 2, backend="gloo"):
        assert torch.equal(out, torch.tensor([1.0, 1.0, 2.0, 2.0]))
        assert calls[0]["end"] - calls[0]["start"] >= 0.01 + 8 / 1e6


def test_the_bytes_held_are_the_storages():
    a = torch.zeros(10)
    assert zero_bench.storage_bytes([a, a[2:], None, torch.zeros(3, dtype=torch.bfloat16)]) == 46


def test_peak_bytes_counts_new_storages_once_and_their_frees():
    held = torch.zeros(100)

    def work():
        a = held * 2                       # 400 bytes
        b = a[10:] + 1                     # 360 bytes: 760 at once
        del a                              # 360
        c = torch.zeros(50, dtype=torch.float64)   # 400: 760 again
        return b, c, held[:5]              # a view of a held storage is not new

    assert zero_bench.peak_bytes(work) == 760


def test_the_lecture_has_the_shape():
    got = shape.shape(LECTURE)
    assert got["minutes"] <= shape.MINUTES and got["cells over 60"] == 0
    assert got["lines over 88"] == 0 and got["before section 1"] <= shape.BEFORE_SECTION_1
    assert got["wordy prints"] == 0 and got["chosen texts"] == 0


PEAK_DIM, PEAK_HIDDEN, PEAK_DEPTH, PEAK_BATCH = 64, 256, 16, 2


class _KeepsGathered(ShardedUnit):
    """Wrong on purpose: keeps the parameters it gathers for forward, never frees them."""

    def unshard(self):
        if getattr(self, "kept", None) is None:
            self.kept = super().unshard()
        return self.kept


def _zero3_peaks(rank, n, repeats=3):
    x, y = tiny.batch(PEAK_BATCH, PEAK_DIM, seed=1, dtype=torch.float32)

    def units(cls):
        model = tiny.model(PEAK_DIM, PEAK_HIDDEN, PEAK_DEPTH, seed=0, dtype=torch.float32)
        net = nn.Sequential(*[cls(layer, torch.bfloat16, torch.float32) for layer in model])
        return net, lambda: tiny.loss(net(x).float(), y).backward()
    out = {}
    for name, cls in (("ours", ShardedUnit), ("keeps", _KeepsGathered)):
        grads = []
        for owned in (False, True):           # the stand-in collectives compute the same
            net, step = units(cls)
            with zero_bench.caller_owned_collectives() if owned else contextlib.nullcontext():
                step()
            grads.append([p.grad for p in net.parameters()])
        net, step = units(cls)
        for p in net.parameters():            # held: the shards and their gradients, which
            p.grad = torch.zeros_like(p)      # backward adds to in place
        with zero_bench.caller_owned_collectives():
            peaks = [zero_bench.peak_bytes(step) for _ in range(repeats)]
        out[name] = dict(peaks=peaks, same=all(map(torch.equal, *grads)),
                         numel=net[0].shard.numel() * n)
    return out


def _assert_zero3_peak(peak, numel, n, layers):
    """zero_bench.assert_zero3_peak (the lecture's) with this test's activations, and a model
    far below all layers gathered (L G)."""
    gathered = numel * 2
    lo, hi = zero_bench.assert_zero3_peak(peak, numel, n, layers * PEAK_BATCH * 2 * (
        PEAK_DIM + PEAK_HIDDEN))
    assert hi - lo + gathered < layers * gathered / 2, ("a model that tells", lo, hi, gathered)


def test_a_zero3_steps_peak_is_about_one_gathered_unit_not_all_of_them():
    """The peak of a ZeRO-3 forward + backward over L = 16 ShardedUnits (bf16 parameters,
    fp32 reduction, 2 gloo ranks), above what was held (fp32 shards, their gradients), is
    within the model: at least one unit's gathered parameters G = N p (N the padded numel, p
    bytes per param_dtype value: it must gather them) and at most two units' (2G) plus the
    activations the forward saves (at most L batch 2(dim + hidden) values in param_dtype) and
    the backward's transients: the gradient of the gathered flat in param_dtype (N p), its cast
    to reduce_dtype (N r) and the reduced slice (N r / n): far below L G. A unit that keeps its
    gathered parameters after forward (about L G) fails it. Measured with zero_bench.PeakBytes
    inside caller_owned_collectives (gloo's worker thread would otherwise time the frees of a
    finished collective's tensors: the peak moved by 1.5 G between runs); the peak is then the
    same in every repeat, and the stand-in collectives give the same gradients as gloo's."""
    for res in spawn(_zero3_peaks, 2, backend="gloo"):
        ours, keeps = res["ours"], res["keeps"]
        assert ours["same"] and keeps["same"]
        assert len(set(ours["peaks"])) == 1, ours["peaks"]      # deterministic
        _assert_zero3_peak(ours["peaks"][0], ours["numel"], 2, PEAK_DEPTH)
        with pytest.raises(AssertionError):
            _assert_zero3_peak(keeps["peaks"][0], keeps["numel"], 2, PEAK_DEPTH)
