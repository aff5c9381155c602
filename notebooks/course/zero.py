"""Lecture 06's pieces that later lectures reuse, exactly as notebooks/06_zero.ipynb shows them
(its cells marked #@save). Written by `python -m helpers.site.saved`: edit the lecture, then run it again."""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call


def model_state_bytes(stage, psi, n, p_bytes=2, g_bytes=2, k=12):
    """Bytes of parameters, gradients, optimizer state per rank at `stage` (0: DDP)."""
    return {"params": p_bytes * psi / (n if stage >= 3 else 1),
            "grads": g_bytes * psi / (n if stage >= 2 else 1),
            "optim": k * psi / (n if stage >= 1 else 1)}

def flat_shard(t, n, rank):
    """Rank `rank`'s 1/n of `t`, laid flat and padded with zeros to a multiple of n."""
    flat = t.detach().reshape(-1)
    size = -(-flat.numel() // n)                       # ceil(numel / n)
    padded = F.pad(flat, (0, size * n - flat.numel()))
    return padded[rank * size:(rank + 1) * size].clone()

class ZeroOptimizer:
    """ZeRO-1: like ZeroRedundancyOptimizer(params, optimizer_class, **defaults), but
    each rank owns 1/n of every tensor (flat, padded) and keeps the optimizer state
    of that slice only."""

    def __init__(self, params, optimizer_class, *, master_dtype=None, **defaults):
        self.params = [p for p in params if p.requires_grad]   # frozen ones: left out
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        self.shards = [flat_shard(p, self.n, self.rank).to(master_dtype or p.dtype)
                       for p in self.params]   # the master copy of this rank's slices
        self.grads = [None] * len(self.params)   # ZeRO-2: reduced gradient slices
        self.optim = optimizer_class(self.shards, **defaults)

    def zero_grad(self):
        for i, p in enumerate(self.params):
            p.grad, self.grads[i] = None, None

    def mean_grad(self, p, shard):
        """This rank's slice of the gradient averaged over ranks: a reduce-scatter."""
        full = F.pad(p.grad.reshape(-1), (0, shard.numel() * self.n - p.numel()))
        mine = full.new_empty(shard.numel())
        dist.reduce_scatter_single(mine, full)   # the sum over ranks of slice `rank`
        return mine / self.n

    @torch.no_grad()
    def step(self):
        for i, (p, shard) in enumerate(zip(self.params, self.shards)):
            if p.grad is None and self.grads[i] is None:   # no gradient: skipped
                continue                # as torch's optimizers do, every rank alike
            grad = self.mean_grad(p, shard) if self.grads[i] is None else self.grads[i]
            shard.grad = grad.to(shard.dtype)
        self.optim.step()                               # only this rank's slices
        for p, shard in zip(self.params, self.shards):
            full = p.new_empty(shard.numel() * self.n)
            dist.all_gather_single(full, shard.to(p.dtype))  # everyone's updated slices
            p.copy_(full[:p.numel()].view_as(p))
            shard.grad = None

class Zero2Optimizer(ZeroOptimizer):
    """ZeRO-2: each gradient is reduce-scattered as soon as backward has it; only the
    slice stays."""

    def __init__(self, params, optimizer_class, *, master_dtype=None, **defaults):
        super().__init__(params, optimizer_class, master_dtype=master_dtype, **defaults)
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(lambda p, i=i: self.keep_slice(i))

    @torch.no_grad()
    def keep_slice(self, i):
        p = self.params[i]
        mine = self.mean_grad(p, self.shards[i])
        # accumulate over micro-batches; the full gradient is gone at once
        self.grads[i] = mine if self.grads[i] is None else self.grads[i] + mine
        p.grad = None

class GatherParams(torch.autograd.Function):
    """Forward: the unit's full flat parameters (all-gather). Backward: the mean
    gradient of this rank's shard (reduce-scatter the full gradient, divide by n)."""

    @staticmethod
    def forward(ctx, shard, unit):
        ctx.unit = unit
        return unit.unshard()

    @staticmethod
    def backward(ctx, grad_full):
        unit = ctx.unit
        unit.full_again = None     # this unit's backward is over: free its parameters
        mine = grad_full.new_empty(unit.shard.numel(), dtype=unit.reduce_dtype)
        dist.reduce_scatter_single(mine, grad_full.to(unit.reduce_dtype))
        return (mine / unit.n).to(unit.shard.dtype), None

def place_only(unit, full):
    """Saved-tensor hooks: autograd keeps a view of `full` as its place in the buffer;
    backward gets it from the unit gathered again (once)."""
    ptr = full.untyped_storage().data_ptr()

    def pack(t):
        if t.untyped_storage().data_ptr() != ptr:
            return t
        return (t.storage_offset(), t.shape, t.stride())

    def unpack(saved):
        if isinstance(saved, torch.Tensor):
            return saved
        if unit.full_again is None:
            unit.full_again = unit.unshard()
        offset, shape, stride = saved
        return unit.full_again.as_strided(shape, stride, offset)
    return pack, unpack

class ShardedUnit(nn.Module):
    """ZeRO-3 / FSDP for one layer: its parameters live as a flat padded shard per rank,
    gathered (in param_dtype) around its forward and again in its backward."""

    def __init__(self, layer, param_dtype=None, reduce_dtype=None):
        super().__init__()
        self.n, rank = dist.get_world_size(), dist.get_rank()
        named = list(layer.named_parameters())
        assert all(p.requires_grad for _, p in named), "a frozen parameter (as FSDP1)"
        self.names, self.shapes = [k for k, _ in named], [p.shape for _, p in named]
        flat = torch.cat([p.detach().reshape(-1) for _, p in named])
        self.numel = flat.numel()
        self.shard = nn.Parameter(flat_shard(flat, self.n, rank))   # the optimizer's
        self.param_dtype = param_dtype or flat.dtype
        self.reduce_dtype = reduce_dtype or self.param_dtype
        self.bufs = dict(layer.named_buffers())      # buffers stay whole, as in FSDP2
        self.code = [layer.to("meta")]   # a list: the layer's code, not its parameters
        self.pending, self.full_again = None, None

    def start_unshard(self):
        """Issue the all-gather of the full flat parameters; unshard() waits for it."""
        full = self.shard.new_empty(self.shard.numel() * self.n, dtype=self.param_dtype)
        work = dist.all_gather_single(full, self.shard.detach().to(self.param_dtype),
                                      async_op=True)
        self.pending = (work, full)

    def unshard(self):
        if self.pending is None:
            self.start_unshard()
        (work, full), self.pending = self.pending, None
        work.wait()
        return full

    def views(self, full):
        flat = full[:self.numel].split([s.numel() for s in self.shapes])
        return {k: v.view(s) for k, v, s in zip(self.names, flat, self.shapes)}

    def forward(self, x):
        x = x.to(self.param_dtype) if x.is_floating_point() else x   # token ids stay
        full = GatherParams.apply(self.shard, self)
        with torch.autograd.graph.saved_tensors_hooks(*place_only(self, full)):
            return functional_call(self.code[0], self.views(full) | self.bufs, (x,))

    def full_state_dict(self):
        """The layer's full parameters in the shard's dtype (every rank gets them)."""
        full = self.shard.new_empty(self.shard.numel() * self.n)
        dist.all_gather_single(full, self.shard.detach())
        return {k: v.clone() for k, v in self.views(full).items()}

def prefetch_forward(units):
    """Before unit i's forward, issue its all-gather (if not yet issued) and unit i+1's
    (FSDP2's set_modules_to_forward_prefetch: i+1's after i's all-gather copy-out)."""
    def hook(unit, args, nxt):
        if unit.pending is None:
            unit.start_unshard()
        nxt.start_unshard()
    return [unit.register_forward_pre_hook(lambda u, a, nxt=nxt: hook(u, a, nxt))
            for unit, nxt in zip(units, units[1:])]

def forward_model(gather_s, compute_s, layers, share=0.0):
    """Seconds of a forward of L units, (in turns, prefetched): in turns L(g + c);
    prefetched, the first gather is exposed and each later one runs beside the unit
    before it, slowing it by `share` while it runs (or outlasting it)."""
    g, c = gather_s, compute_s
    beside = g if g / (1 + share) >= c else c + g * share / (1 + share)
    return layers * (g + c), g + (layers - 1) * beside + c

def assert_forward_model(added_s, gather_s, compute_s, layers, share, tolerance_s):
    """What the gathers add to each forward ({prefetch: seconds}) is the model's, within
    tolerance_s[prefetch] (the rounds' spread and the floor's)."""
    with_g = forward_model(gather_s, compute_s, layers, share)
    without = forward_model(0.0, compute_s, layers, share)
    for p, added in added_s.items():
        model = with_g[p] - without[p]
        assert abs(added - model) <= tolerance_s[p], (f"prefetch={p}", added, model)
