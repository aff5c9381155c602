"""Lecture 06 (ZeRO): its wrappers against torch's, each with a negative control, its key
measured claim with negative controls, and its shape.

- course.zero.ZeroOptimizer / Zero2Optimizer (ZeRO-1 and 2 as an optimizer wrapper) reach
  (on 2 ranks: a sum of two has one order and halving is exact) bit for bit the parameters of torch.distributed.optim.ZeroRedundancyOptimizer (with DDP) on 2
  gloo ranks, in float32 and in bfloat16; a wrapper that skips the all-gather after the step is
  caught by the same comparison. Zero2Optimizer accumulates over micro-batches (two backwards,
  one step = ZeroOptimizer's, to float64 roundings); one that overwrites the kept slice is caught.
- course.zero.ShardedUnit (ZeRO-3 as a module wrapper per layer) reaches bit for bit the
  parameters of FSDP2's fully_shard, in float32 and with MixedPrecisionPolicy(bf16, fp32); a
  unit that reduce-scatters without averaging is caught.
- The key claim (section 5, course.zero.assert_prefetch_model): on device-like layers and a
  paced all-gather, a forward in turns takes L(g + c) and a prefetched one g + (L-1)max(g,c) + c,
  each above its model by less than half the predicted saving. A serialised schedule passed as
  the prefetched one fails it, and so does a model whose compute is off by a factor of two.
  The stand-ins take time on a clock that needs no core, so this holds on a loaded machine.
- A ZeRO-3 step's peak (section 4) is what a rank holds plus one or two gathered units and the
  gradient's buffers, not all layers; a unit that never frees its gathered parameters fails it.
"""
import contextlib
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course.zero import (GatherParams, ShardedUnit, Zero2Optimizer, ZeroOptimizer,
                         assert_prefetch_model, place_only, prefetch_forward)
from helpers import shape, standins, tiny, zero_bench
from helpers.spawn import spawn

LECTURE = Path(shape.NOTEBOOKS) / "06_zero.ipynb"
HP = dict(lr=1e-2, weight_decay=0.1)
DIM, HIDDEN, DEPTH, BATCH, STEPS = 16, 23, 3, 12, 3


def _batch(rank, n, dtype):
    x, y = tiny.batch(BATCH, DIM, seed=1, dtype=dtype)
    b = BATCH // n
    return x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]


def _train(rank, n, dtype, wrap, full=None):
    model = tiny.model(DIM, HIDDEN, DEPTH, seed=0, dtype=dtype)
    (x, y), (net, opt) = _batch(rank, n, dtype), wrap(model)
    for _ in range(STEPS):
        opt.zero_grad()
        tiny.loss(net(x).to(dtype), y).backward()
        opt.step()
    if full:
        return full(net)
    return {k: p.detach().clone() for k, p in model.named_parameters()}


class _NoGather(ZeroOptimizer):
    """Wrong on purpose: the step updates this rank's slices but never all-gathers them."""

    @torch.no_grad()
    def step(self):
        for p, shard in zip(self.params, self.shards):
            shard.grad = self.mean_grad(p, shard).to(shard.dtype)
        self.optim.step()


def _torch_zero1(model):
    from torch.distributed.optim import ZeroRedundancyOptimizer
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **HP)
    return nn.parallel.DistributedDataParallel(model), opt


def _optimizers(rank, n, dtype):
    ours = {name: (lambda m, cls=cls: (m, cls(m.parameters(), torch.optim.AdamW, **HP)))
            for name, cls in (("zero1", ZeroOptimizer), ("zero2", Zero2Optimizer),
                              ("no gather", _NoGather))}
    out = {name: _train(rank, n, dtype, wrap) for name, wrap in ours.items()}
    out["torch"] = _train(rank, n, dtype, _torch_zero1)
    return out


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_optimizer_wrappers_equal_zero_redundancy_optimizer(dtype):
    for res in spawn(_optimizers, 2, args=(dtype,), backend="gloo"):
        assert _same(res["zero1"], res["torch"]) and _same(res["zero2"], res["torch"])
        assert not _same(res["no gather"], res["torch"])      # the negative control is caught


class _Overwrites(Zero2Optimizer):
    """Wrong on purpose (the old keep_slice): each backward overwrites the kept slice."""

    @torch.no_grad()
    def keep_slice(self, i):
        self.grads[i] = self.mean_grad(self.params[i], self.shards[i])
        self.params[i].grad = None


def _accumulated(rank, n):
    out = {}
    for name, cls in (("zero1", ZeroOptimizer), ("zero2", Zero2Optimizer),
                      ("overwrites", _Overwrites)):
        model = tiny.model(DIM, HIDDEN, DEPTH, seed=0, dtype=torch.float64)
        x, y = _batch(rank, n, torch.float64)
        opt = cls(model.parameters(), torch.optim.AdamW, **HP)
        opt.zero_grad()
        for half in (slice(0, len(x) // 2), slice(len(x) // 2, None)):   # two micro-batches
            tiny.loss(model(x[half]), y[half]).backward()
        opt.step()
        out[name] = {k: p.detach().clone() for k, p in model.named_parameters()}
    return out


def test_zero2_accumulates_gradients_over_micro_batches():
    for res in spawn(_accumulated, 2, backend="gloo"):
        # float64: (g1 + g2) / n reduced once against g1 / n + g2 / n, roundings apart
        assert _close(res["zero2"], res["zero1"])
        assert not _close(res["overwrites"], res["zero1"])   # the old code is caught


def _close(a, b):
    return all(torch.allclose(a[k], b[k], rtol=1e-12, atol=1e-14) for k in a)


def test_master_dtype_is_keyword_only():
    with pytest.raises(TypeError):
        ZeroOptimizer([], torch.optim.AdamW, torch.float32)


class _SumNotMean(GatherParams):
    """Wrong on purpose: the shard's gradient is the sum over ranks, not the mean."""

    @staticmethod
    def backward(ctx, grad_full):
        grad, _ = GatherParams.backward(ctx, grad_full)
        return grad * ctx.unit.n, None


class _SummingUnit(ShardedUnit):
    def forward(self, x):
        full = _SumNotMean.apply(self.shard, self)
        with torch.autograd.graph.saved_tensors_hooks(*place_only(self, full)):
            return torch.func.functional_call(self.code[0], self.views(full),
                                              (x.to(self.param_dtype),))


def _units(cls, policy):
    def wrap(model):
        net = nn.Sequential(*[cls(layer, *policy) for layer in model])
        return net, torch.optim.AdamW(net.parameters(), **HP)
    return wrap


def _fsdp(policy):
    def wrap(model):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for m in [*model, model]:
            fully_shard(m, mesh=mesh, mp_policy=MixedPrecisionPolicy(*policy))
        return model, torch.optim.AdamW(model.parameters(), **HP)
    return wrap


def _full_units(net):
    return {f"{i}.{k}": v for i, u in enumerate(net) for k, v in u.full_state_dict().items()}


def _full_fsdp(net):
    return {k: p.full_tensor() for k, p in net.named_parameters()}


def _sharded(rank, n, policy):
    out = {name: _train(rank, n, torch.float32, _units(cls, policy), _full_units)
           for name, cls in (("ours", ShardedUnit), ("sum", _SummingUnit))}
    out["fsdp"] = _train(rank, n, torch.float32, _fsdp(policy), _full_fsdp)
    model = tiny.model(DIM, HIDDEN, DEPTH, seed=0, dtype=torch.float32)
    net = _units(ShardedUnit, policy)(model)[0]
    out["dtype"] = net(_batch(rank, n, torch.float32)[0]).dtype
    return out


@pytest.mark.parametrize("policy", [(None, None), (torch.bfloat16, torch.float32)])
def test_the_module_wrapper_equals_fully_shard(policy):
    for res in spawn(_sharded, 2, args=(policy,), backend="gloo"):
        assert _same(res["ours"], res["fsdp"])
        assert not _same(res["sum"], res["fsdp"])            # the negative control is caught
        assert res["dtype"] == (policy[0] or torch.float32)


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


def _float64(rank, n):
    out = {name: _train(rank, n, torch.float64, (lambda m, cls=cls: (m, cls(
        m.parameters(), torch.optim.AdamW, **HP)))) for name, cls in
        (("zero1", ZeroOptimizer), ("zero2", Zero2Optimizer))}
    out["zero3"] = _train(rank, n, torch.float64, _units(ShardedUnit, (None, None)),
                          _full_units)
    return out


@pytest.mark.parametrize("n", [3, 4])
def test_every_stage_equals_one_process_in_float64_on_more_ranks(n):
    """The lecture checks WORLD_SIZE ranks; padding and uneven rows show on 3 and 4 too."""
    ref = _train(0, 1, torch.float64, lambda m: (m, torch.optim.AdamW(m.parameters(), **HP)))
    for res in spawn(_float64, n, backend="gloo"):
        for params in res.values():
            for k in ref:     # float64: the same AdamW on the same numbers, roundings apart
                torch.testing.assert_close(params[k], ref[k], rtol=1e-12, atol=1e-14)


def _gathers(rank, n):
    from helpers import trace
    x, y = _batch(rank, n, torch.float32)
    counts = {}
    for name, wrap in (("ours", _units(ShardedUnit, (None, None))),
                       ("fsdp", _fsdp((None, None))), ("fsdp2", _fsdp_no_reshard())):
        net, _ = wrap(tiny.model(DIM, HIDDEN, DEPTH, seed=0, dtype=torch.float32))
        tiny.loss(net(x), y).backward()        # the first step sets FSDP up
        with trace.calls() as log:
            tiny.loss(net(x), y).backward()
        counts[name] = (log.count("all_gather"), log.count("reduce_scatter"))
    return counts


def _fsdp_no_reshard():
    def wrap(model):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for m in [*model, model]:
            fully_shard(m, mesh=mesh, reshard_after_forward=False)
        return model, None
    return wrap


def test_zero3_gathers_each_layer_twice_and_stage2_traffic_once():
    for counts in spawn(_gathers, 2, backend="gloo"):
        assert counts["ours"] == counts["fsdp"] == (2 * DEPTH, DEPTH), counts
        assert counts["fsdp2"] == (DEPTH, DEPTH), counts     # reshard_after_forward=False


def _prefetched(rank, n):
    def wrap(prefetch):
        def inner(model):
            net, opt = _units(ShardedUnit, (None, None))(model)
            if prefetch:
                prefetch_forward(list(net))
            return net, opt
        return inner
    return [_train(rank, n, torch.float64, wrap(p), _full_units) for p in (False, True)]


def test_prefetching_changes_when_not_what():
    for plain, ahead in spawn(_prefetched, 2, backend="gloo"):
        assert _same(plain, ahead)


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


def _assert_zero3_peak(peak, numel, n, layers, p=2, r=4):
    """peak - activations within [G, 2G + N p + N r + N r / n] (see the test's docstring)."""
    gathered = numel * p
    acts = layers * PEAK_BATCH * 2 * (PEAK_DIM + PEAK_HIDDEN) * p
    transients = numel * p + numel * r + numel // n * r
    assert gathered <= peak - acts, ("gathers", peak, acts, gathered)
    assert peak - acts <= 2 * gathered + transients < layers * gathered / 2, (
        "at most two units", peak, acts, gathered, transients)


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
