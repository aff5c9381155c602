"""Lecture 06 (ZeRO): its key measured claim with negative controls, the peak of a ZeRO-3 step,
the bytes instruments and its shape (its wrappers against torch's: tests/test_zero_wrappers.py).

- The key claim (section 5, course.zero.assert_prefetch_model): on device-like layers and a
  paced all-gather, a forward in turns takes L(g + c) and a prefetched one g + (L-1)max(g,c) + c,
  each above its model by less than half the predicted saving. A serialised schedule passed as
  the prefetched one fails it, and so does a model whose compute is off by a factor of two.
  The stand-ins take time on a clock that needs no core, so this holds on a loaded machine.
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

from course.zero import ShardedUnit, assert_prefetch_model, prefetch_forward
from helpers import standins, tiny
from helpers.site import shape
from machinery import l06_zero as zero_bench
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "06_zero.ipynb"


def _forward_times(rank, n, prefetch, gather_s, compute_s, rounds=3):
    layers = [standins.DeviceLike(nn.Linear(8, 8), compute_s) for _ in range(4)]
    model = nn.Sequential(*[ShardedUnit(layer) for layer in layers])
    if prefetch:
        prefetch_forward(list(model))
    times = []
    with zero_bench.paced_gather(gather_s) as link:
        for _ in range(rounds):
            dist.barrier()
            compute, _ = zero_bench.forward_events(model, torch.ones(2, 8), layers, link)
            times.append(compute[-1]["end"])
    return sorted(times)[len(times) // 2]


def test_the_key_claim_holds_for_prefetching_and_fails_for_a_serialised_schedule():
    g = c = 0.02
    serial, ahead = (max(spawn(_forward_times, 2, args=(p, g, c), backend="gloo"))
                     for p in (False, True))
    assert_prefetch_model(serial, ahead, g, c, 4)
    with pytest.raises(AssertionError):
        assert_prefetch_model(serial, serial, g, c, 4)       # a serialised "prefetch"
    with pytest.raises(AssertionError):
        assert_prefetch_model(serial, ahead, g, 2 * c, 4)    # a model off by a factor


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
