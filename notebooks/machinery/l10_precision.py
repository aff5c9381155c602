"""Measuring machinery of lecture 10's compressed gradients: DDP trained once per communication hook,
with the bytes each rank hands to all_reduce counted per step.

    runs = spawn(precision_bench.train_with_hooks, K, args=(hooks, steps, lr, model_kw, rows))
    runs[rank][name]: {"losses", "bytes", "calls", "dtypes", "params", "grad norms"}

`hooks[name]` is a function returning (state, hook) for `DistributedDataParallel.register_comm_hook`
(None: DDP's own all-reduce). Every run starts from `tiny.model(**model_kw, seed=0)` in float32 and
does full-batch SGD on its shard of `tiny.batch(rows)` (rank r takes rows r, r + K, ...).

The bytes are counted where the hooks hand them over: `dist.all_reduce` (and `dist.all_gather`) are
replaced, on each rank and for the run only, by functions that log (dtype, bytes) and call the
originals. The hooks look the function up in `torch.distributed` at every call, so this sees the
all-reduces PowerSGD issues from its futures' callbacks too, whatever thread runs them (the
dispatch-mode tracer of helpers.trace is thread-local and would miss those).

    precision_bench.assert_scales_with_u(d_bf16, d_fp16, 2.0**-8 / 2.0**-11)

The lecture's claim about the 2-byte hooks: the distance from the exact run is proportional to the
format's unit roundoff u (each step adds about K roundings of relative size u), so the ratio of two
formats' distances is the ratio of their u within a factor 2 (their rounding errors are not
distributed alike: fp16's subnormals). tests/test_lecture_10.py feeds it a pair of runs in one
format (ratio 1), which must fail it.
"""
import contextlib
import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from helpers import tiny
from helpers.patching import patched
from helpers.spawn import device


@contextlib.contextmanager
def counting_collectives(log):
    """Inside: dist.all_reduce and dist.all_gather also append (dtype, bytes sent) to log."""
    originals = {name: getattr(dist, name) for name in ("all_reduce", "all_gather")}

    def counted(name):
        def send(*args, **kwargs):
            tensor = args[0] if name == "all_reduce" else args[1]   # all_gather(outs, input)
            log.append((tensor.dtype, tensor.numel() * tensor.element_size()))
            return originals[name](*args, **kwargs)
        return send

    with patched(dist, **{name: counted(name) for name in originals}):
        yield


def no_cuda_sync_for_cpu():
    """Inside: torch.cuda.synchronize(a CPU device) returns at once. torch's PowerSGD hooks end with
    `torch.cuda.synchronize(the bucket's device)` whenever CUDA is available (powerSGD_hook.py,
    torch 2.13), which raises "Expected a cuda device, but got: cpu" for a CPU bucket: a gloo rank on
    a machine with a GPU (seen on an H100). A CPU device has nothing to wait for."""
    real = torch.cuda.synchronize

    def synchronize(device=None):
        if device is None or torch.device(device).type != "cpu":
            real(device)
    return patched(torch.cuda, synchronize=synchronize)


def train_with_hooks(rank, world_size, hooks, steps, lr, model_kw, rows):
    """The same float32 training once per hook: losses, bytes and calls per step, parameters."""
    dev = device()
    x, y = tiny.batch(rows, model_kw["dim"], seed=1, dtype=torch.float32, device=dev)
    x, y = x[rank::world_size], y[rank::world_size]
    out = {}
    for name, make in hooks.items():
        model = tiny.model(**model_kw, seed=0, dtype=torch.float32, device=dev)
        ddp = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
        if make is not None:
            ddp.register_comm_hook(*make())
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        log, losses, sent, calls, norms = [], [], [], [], []
        with counting_collectives(log), no_cuda_sync_for_cpu():
            for _ in range(steps):
                before = len(log)
                opt.zero_grad()
                loss = tiny.loss(ddp(x), y)
                loss.backward()                   # returns once every hook's future is done
                norms.append(math.sqrt(sum(p.grad.double().pow(2).sum().item()
                                           for p in model.parameters())))
                opt.step()
                losses.append(loss.item())
                sent.append(sum(b for _, b in log[before:]))
                calls.append(len(log) - before)
        out[name] = {"losses": losses, "bytes": sent, "calls": calls,
                     "dtypes": sorted({str(d).replace("torch.", "") for d, _ in log}),
                     "params": [p.detach().cpu() for p in model.parameters()], "grad norms": norms}
    return out


def assert_scales_with_u(d_coarse, d_fine, u_ratio, factor=2.0):
    """d_coarse / d_fine within `factor` of u_ratio (the coarse format's u over the fine one's)."""
    ratio = d_coarse / d_fine
    assert u_ratio / factor <= ratio <= u_ratio * factor, (
        f"the distances' ratio {ratio:.3g} is not the formats' u ratio {u_ratio:g} within a "
        f"factor {factor:g}: the distance does not scale with the rounding")
