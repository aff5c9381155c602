"""Lectures 05 and 06's wrappers on a real model, against torch's counterparts (issue 49).

The model is a small causal transformer language model: a token embedding (integer input), a
frozen positional table, two pre-norm blocks (LayerNorm, attention, MLP), a final LayerNorm and a
head tied to the embedding; one variant adds a bf16 parameter to the fp32 model (mixed dtypes).
Each wrapper runs it on 2 gloo ranks, each rank on its half of the batch, and must end with the
parameters of torch's counterpart, bit for bit (a sum of two numbers has one order and halving
is exact), in float32 and bfloat16:

- course.ddp.BucketedDDP against DistributedDataParallel, SGD: with the default cap, with
  bucket_cap_mb=0 (one parameter a bucket, as torch's bucket assignment gives) and with mixed
  dtypes (a bucket never casts: each holds one dtype). A forward after a backward whose
  finish_gradient_sync() was skipped raises.
- course.zero.ZeroOptimizer and Zero2Optimizer against ZeroRedundancyOptimizer under DDP, AdamW:
  the frozen parameter is left alone, the tied weight counted once; a parameter without a
  gradient is skipped, as torch's optimizers skip it.
- course.zero.ShardedUnit against FSDP2's fully_shard (the same units), plain and with
  MixedPrecisionPolicy(bf16, fp32): the embedding's token ids are not cast. A unit holding a
  frozen parameter is refused (flat sharding needs one requires_grad, as FSDP1's FlatParameter).
Negative controls: a model whose replicas never synchronise fails each comparison. A layer's
buffers stay whole in a ShardedUnit, as in fully_shard.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course.ddp import BucketedDDP
from course.zero import ShardedUnit, Zero2Optimizer, ZeroOptimizer
from helpers.spawn import spawn

VOCAB, DIM, SEQ, BATCH, STEPS = 37, 16, 8, 4, 3


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, h):
        q, k, v = self.qkv(self.norm1(h)).chunk(3, dim=-1)
        h = h + self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True))
        return h + self.mlp(self.norm2(h))


class TinyLM(nn.Module):
    """Embedding, frozen positions, blocks, final norm, tied head; `mixed`: a bf16 scale."""

    def __init__(self, mixed=False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(0.1 * torch.randn(SEQ, DIM), requires_grad=False)
        self.blocks = nn.Sequential(Block(DIM), Block(DIM))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.embed.weight                      # tied
        self.scale = nn.Parameter(torch.ones(DIM, dtype=torch.bfloat16)) if mixed else None

    def forward(self, tokens):
        h = self.blocks(self.embed(tokens) + self.pos.to(self.embed.weight.dtype))
        if self.scale is not None:
            h = h * self.scale.to(h.dtype)
        return self.head(self.norm(h))


def model(dtype, mixed=False):
    """The seeded model in `dtype` (mixed: fp32 with its bf16 scale)."""
    torch.manual_seed(0)
    return TinyLM(mixed) if mixed else TinyLM().to(dtype)


def batch(rank, n):
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=g)
    b = BATCH // n
    mine = tokens[rank * b:(rank + 1) * b]
    return mine[:, :-1], mine[:, 1:]


def loss(logits, targets):
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def params(m):
    return {k: p.detach().clone() for k, p in m.named_parameters(remove_duplicate=False)}


def same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- lecture 05: BucketedDDP against DistributedDataParallel ---------------------------------

def _ddp(rank, n, dtype, mixed, cap, wrapper):
    m = model(dtype, mixed)
    (x, y), kwargs = batch(rank, n), ({} if cap is None else {"bucket_cap_mb": cap})
    net = m if wrapper is None else wrapper(m, **kwargs)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(STEPS):
        opt.zero_grad()
        loss(net(x), y).backward()
        if isinstance(net, BucketedDDP):
            net.finish_gradient_sync()
        opt.step()
    buckets = [[p.dtype for p in b] for b in getattr(net, "buckets", [])]
    flats = [f.dtype for f in getattr(net, "flat", [])]
    return params(m), buckets, flats


def _ddp_all(rank, n, dtype, mixed, cap):
    wrappers = {"ours": BucketedDDP, "torch": nn.parallel.DistributedDataParallel, "none": None}
    return {name: _ddp(rank, n, dtype, mixed, cap, w) for name, w in wrappers.items()}


@pytest.mark.parametrize("dtype, mixed, cap", [(torch.float32, False, None),
                                               (torch.bfloat16, False, None),
                                               (torch.float32, False, 0),
                                               (torch.float32, True, None)],
                         ids=["float32", "bfloat16", "cap 0", "mixed dtypes"])
def test_bucketed_ddp_equals_torch_ddp_on_a_transformer(dtype, mixed, cap):
    for got in spawn(_ddp_all, 2, args=(dtype, mixed, cap), backend="gloo"):
        (ours, buckets, flats), (theirs, _, _), (alone, _, _) = got.values()
        assert same(ours, theirs)
        assert not same(alone, theirs)                  # unsynchronised replicas: caught
        assert all(len(set(b)) == 1 for b in buckets)   # one dtype a bucket, its buffer's
        assert [b[0] for b in buckets] == flats
        if cap == 0:
            assert all(len(b) == 1 for b in buckets)
        if mixed:
            assert set(flats) == {torch.float32, torch.bfloat16}


def _skipped_finish(rank, n):
    net = BucketedDDP(model(torch.float32))
    x, y = batch(rank, n)
    loss(net(x), y).backward()                          # finish_gradient_sync() forgotten
    with pytest.raises(AssertionError, match="finish_gradient_sync"):
        net(x)
    net.finish_gradient_sync()
    net(x)                                              # after it, forwards run again
    return True


def test_a_skipped_finish_gradient_sync_raises_at_the_next_forward():
    assert all(spawn(_skipped_finish, 2, backend="gloo"))


# --- lecture 06: ZeRO-1/2 against ZeroRedundancyOptimizer, ShardedUnit against fully_shard ---

def _zero(rank, n, dtype, which):
    m = model(dtype)
    (x, y), hp = batch(rank, n), dict(lr=1e-2, weight_decay=0.1)
    if which == "torch":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        net = nn.parallel.DistributedDataParallel(m)
        opt = ZeroRedundancyOptimizer(m.parameters(), torch.optim.AdamW, **hp)
    elif which == "none":                               # no synchronisation
        net, opt = m, torch.optim.AdamW(m.parameters(), **hp)
    else:
        cls = {"zero1": ZeroOptimizer, "zero2": Zero2Optimizer}[which]
        net, opt = m, cls(m.parameters(), torch.optim.AdamW, **hp)
    for _ in range(STEPS):
        opt.zero_grad()
        loss(net(x), y).backward()
        opt.step()
    return params(m)


def _zero_all(rank, n, dtype):
    return {w: _zero(rank, n, dtype, w) for w in ("zero1", "zero2", "torch", "none")}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_optimizers_equal_zero_redundancy_optimizer_on_a_transformer(dtype):
    for got in spawn(_zero_all, 2, args=(dtype,), backend="gloo"):
        assert same(got["zero1"], got["torch"]) and same(got["zero2"], got["torch"])
        assert not same(got["none"], got["torch"])
        assert torch.equal(got["zero1"]["pos"], model(dtype).pos)   # frozen: untouched


def _no_grad_skipped(rank, n):
    m = model(torch.float32)
    unused = m.blocks[1].out.weight.detach().clone()
    opt = ZeroOptimizer(m.parameters(), torch.optim.AdamW, lr=1e-2)
    x, y = batch(rank, n)
    h = m.embed(x) + m.pos
    loss(m.head(m.norm(m.blocks[0](h))), y).backward()   # block 1 unused: no gradients
    opt.step()
    return torch.equal(m.blocks[1].out.weight, unused) and \
        not torch.equal(m.blocks[0].out.weight, model(torch.float32).blocks[0].out.weight)


def test_a_parameter_without_a_gradient_is_skipped():
    assert all(spawn(_no_grad_skipped, 2, backend="gloo"))


def units(m):
    """The untied model as a sequence of units: embedding, blocks, final norm and head."""
    m.head.weight = nn.Parameter(m.embed.weight.detach().clone())   # untie: one unit each
    m.pos.requires_grad_(False)
    embed = Embed(m.embed, m.pos)
    return [embed, *m.blocks, nn.Sequential(m.norm, m.head)]


class Embed(nn.Module):
    def __init__(self, embed, pos):
        super().__init__()
        self.embed = embed
        self.register_buffer("pos", pos.detach().clone())          # a buffer: stays whole

    def forward(self, tokens):
        return self.embed(tokens) + self.pos.to(self.embed.weight.dtype)


def _sharded(rank, n, policy, fsdp):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    layers = units(model(torch.float32))
    if fsdp is None:                                    # no sharding, no synchronisation
        net = nn.Sequential(*layers)
    elif fsdp:
        net, mesh = nn.Sequential(*layers), init_device_mesh("cpu", (n,))
        for layer in [*net, net]:
            fully_shard(layer, mesh=mesh, mp_policy=MixedPrecisionPolicy(*policy))
    else:
        net = nn.Sequential(*[ShardedUnit(layer, *policy) for layer in layers])
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    x, y = batch(rank, n)
    for _ in range(STEPS):
        opt.zero_grad()
        loss(net(x), y).backward()
        opt.step()
    if fsdp is not False:
        return {k: getattr(p, "full_tensor", p.detach)() for k, p in net.named_parameters()}
    return {f"{i}.{k}": v for i, u in enumerate(net) for k, v in u.full_state_dict().items()}


def _sharded_all(rank, n, policy):
    return {fsdp: _sharded(rank, n, policy, fsdp) for fsdp in (False, True, None)}


@pytest.mark.parametrize("policy", [(None, None), (torch.bfloat16, torch.float32)],
                         ids=["float32", "bf16 / fp32"])
def test_sharded_unit_equals_fully_shard_on_a_transformer(policy):
    for got in spawn(_sharded_all, 2, args=(policy,), backend="gloo"):
        assert same(got[False], got[True])
        assert not same(got[None], got[True])           # unsynchronised: caught


def _frozen_unit(rank, n):
    with pytest.raises(AssertionError, match="frozen"):
        ShardedUnit(nn.Sequential(model(torch.float32).embed, nn.Linear(1, 1).requires_grad_(False)))
    return True


def test_a_unit_with_a_frozen_parameter_is_refused():
    assert all(spawn(_frozen_unit, 2, backend="gloo"))
