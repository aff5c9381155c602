"""Measuring machinery of the frameworks lecture (13): DataParallel's copies counted, the order of
backward and gradient reduction, step times of the written-out DataParallel and of torch's DDP (CPU,
gloo), and a Lightning run inside spawn's ranks.

    with frameworks_bench.copies(("scatter", "replicate", "gather", "reduce_gradients")) as log:
        data_parallel_step(model, x, y, k, lr)         # the lecture's plain code, unchanged
    log.bytes                                          # {"scatter": n, "replicate": n, ...}
    assert_copies_per_step(log.bytes, k, P, X, O)      # the lecture's key claim

`copies` wraps the code from outside: a TorchDispatchMode sees every tensor copy the code makes on
the thread that entered it (aten.clone, aten._to_copy, aten.copy_: what `t.clone()`, `t.to(...)`,
`copy.deepcopy(module)` dispatch to) and files its bytes under the innermost calling function whose
name is one of `phases` ("other" if none is). It does not time anything.

On one CPU every "device" of the written-out DataParallel is this CPU, so a copy stands in for a
transfer between two GPUs; the count is what crosses device 0's link when every copy starts or ends
on device 0 (torch's path without NCCL), whatever the link.
"""
import contextlib
import sys
import time
import warnings

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import timing, tiny
# quiet_stderr: Lightning's default profiler schedule ends its cycle inside the optimizer's step,
# and torch's profiler then warns, from C++, of the range left open (an exception still reaches
# spawn, with its traceback).
from machinery.l05_ddp import quiet_stderr  # noqa: F401 - lecture 15 calls it from here

_COPIES = {"aten.clone.default", "aten._to_copy.default", "aten.copy_.default"}


class _Copies(TorchDispatchMode):
    def __init__(self, phases):
        super().__init__()
        self.phases, self.bytes, self.events = set(phases), {}, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if str(func) in _COPIES:
            frame, label = sys._getframe(1), "other"
            while frame is not None:
                if frame.f_code.co_name in self.phases:
                    label = frame.f_code.co_name
                    break
                frame = frame.f_back
            self.bytes[label] = self.bytes.get(label, 0) + out.numel() * out.element_size()
            self.events.append(label)
        return out


@contextlib.contextmanager
def copies(phases):
    """Inside: every tensor copy on this thread is counted, in bytes, under its phase."""
    mode = _Copies(phases)
    with mode:
        yield mode


def _owns_parameters(module):
    return any(True for _ in module.parameters(recurse=False))


@contextlib.contextmanager
def order(phases):
    """Inside: `copies(phases)`, and `.events` one ordered list of what happened: the phase of each
    copy on this thread, and "backward" each time a module that owns parameters finishes its
    backward, on any thread (a global full backward hook; a first layer, whose input needs no
    gradient, reports when its output's gradient is ready)."""
    from torch.nn.modules.module import register_module_full_backward_hook

    mode = _Copies(phases)

    def backward(module, grad_in, grad_out):
        if _owns_parameters(module):
            mode.events.append("backward")           # list.append: atomic under the GIL
    handle = register_module_full_backward_hook(backward)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            with mode:
                yield mode
    finally:
        handle.remove()


def backward_after(events, name):
    """How many "backward" events come after the first event `name` (None if there is none):
    0 means `name` waited for the whole backward; more means it ran while backward still did."""
    if name not in events:
        return None
    return events[events.index(name):].count("backward")


def ddp_order(rank, world_size, model_kw, per_rank_batch, bucket_cap_mb, steps):
    """Per step, the ordered events of torch's DDP on this rank (gloo, CPU): "backward" as in
    `order`, "all_reduce" when DDP hands a bucket to its communication hook (launches it)."""
    assert dist.get_backend() == "gloo", "ddp_order runs on the CPU: spawn it with gloo"
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.modules.module import register_module_full_backward_hook
    from torch.nn.parallel import DistributedDataParallel

    model = tiny.model(**model_kw, seed=0)
    x, y = tiny.batch(per_rank_batch, model_kw["dim"], seed=1 + rank)
    ddp, events, out = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb), [], []

    def launch(state, bucket):
        events.append("all_reduce")
        return default_hooks.allreduce_hook(None, bucket)

    def backward(module, grad_in, grad_out):
        if _owns_parameters(module):
            events.append("backward")
    ddp.register_comm_hook(None, launch)
    handle = register_module_full_backward_hook(backward)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for _ in range(steps):
            events.clear()
            model.zero_grad()
            tiny.loss(ddp(x), y).backward()
            out.append(list(events))
    handle.remove()
    return out


def copies_model(k, param_bytes, in_bytes, out_bytes):
    """DataParallel's bytes per step over k devices, by phase, for P bytes of parameters and a
    global batch of X bytes of inputs and O bytes of outputs (k divides the batch): chunks 1..k-1
    of the inputs and of the output gradients go out, the model goes to k-1 devices, chunks 1..k-1
    of the outputs and k-1 gradient copies come back to device 0."""
    chunk = lambda n: (k - 1) * n // k          # noqa: E731 - what device 0 keeps does not move
    return {"scatter": chunk(in_bytes) + chunk(out_bytes), "replicate": (k - 1) * param_bytes,
            "gather": chunk(out_bytes), "reduce_gradients": (k - 1) * param_bytes}


def assert_copies_per_step(counted, k, param_bytes, in_bytes, out_bytes):
    """The key claim: one DataParallel step makes exactly the copies of the model above (a count,
    so no tolerance), nothing else."""
    want = copies_model(k, param_bytes, in_bytes, out_bytes)
    want = {phase: n for phase, n in want.items() if n}
    assert counted == want, f"K = {k}: counted {counted}, the model says {want}"


def ddp_bytes(rank, world_size, model_kw, per_rank_batch, steps):
    """Bytes torch's DDP all-reduces per step on this rank (helpers.trace around the steps), and
    what a ring would send for them (lecture 02's model, not gloo's wire bytes). Model and batch
    are on the CPU: launch it with backend="gloo"."""
    from torch.nn.parallel import DistributedDataParallel

    from helpers import trace

    assert dist.get_backend() == "gloo", "ddp_bytes runs on the CPU: spawn it with gloo"
    x, y = tiny.batch(per_rank_batch, model_kw["dim"], seed=1 + rank)
    model = tiny.model(**model_kw, seed=0)
    ddp = DistributedDataParallel(model)
    with trace.calls() as log:
        for _ in range(steps):
            model.zero_grad()
            tiny.loss(ddp(x), y).backward()
    return {"all_reduce": log.nbytes("all_reduce") / steps,
            "ring sent": log.ring_sent("all_reduce") / steps, "calls": log.count() / steps}


def _sgd(model, lr=1e-3):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.grad, alpha=-lr)


def data_parallel_times(rank, world_size, step, k, model_kw, per_replica_batch, steps):
    """Seconds of each of `steps` calls of step(model, x, y, k, lr) (the written-out DataParallel,
    k replica threads in this one process), after two warm-up calls."""
    model = tiny.model(**model_kw, seed=0)
    x, y = tiny.batch(k * per_replica_batch, model_kw["dim"], seed=1)
    return timing.measure(lambda: step(model, x, y, k, 1e-3), warmup=2, iters=steps)


def ddp_times(rank, world_size, model_kw, per_rank_batch, steps):
    """Per-step seconds on this rank of torch's DDP and of the same step without communication,
    taking turns step by step, a barrier before each (the slowest rank's is a step's time).
    On the CPU, whatever the machine has: launch it with backend="gloo"."""
    from torch.nn.parallel import DistributedDataParallel

    assert dist.get_backend() == "gloo", "ddp_times runs on the CPU: spawn it with gloo"
    dev = torch.device("cpu")
    x, y = tiny.batch(per_rank_batch, model_kw["dim"], seed=1 + rank, device=dev)
    model, local = (tiny.model(**model_kw, seed=0, device=dev) for _ in range(2))
    ddp = DistributedDataParallel(model)
    variants = {"torch DDP": (ddp, model), "DDP, no communication": (local, local)}
    times = {name: [] for name in variants}
    for i in range(steps + 2):                                  # two warm-up steps
        for name, (net, params) in variants.items():
            dist.barrier()
            t0 = time.perf_counter()
            params.zero_grad()
            tiny.loss(net(x), y).backward()
            _sgd(params)
            timing.sync(dev)
            if i >= 2:
                times[name].append(time.perf_counter() - t0)
    return times


QUIET_TRAINER = dict(enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)   # a Trainer that writes nothing of its own


def quiet_lightning():
    """Keep Lightning's banners and torch's warnings about Lightning's code out of the notebook."""
    import logging
    import os
    import warnings

    os.environ["KINETO_LOG_LEVEL"] = "6"      # the profiler library's start/stop notices off
    for name in ("pytorch_lightning", "lightning_fabric", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    warnings.filterwarnings("ignore", message="GPU available but not used")
    warnings.filterwarnings("ignore", message=r".*does not have many workers")
    warnings.filterwarnings("ignore", message=r".*profiler default schedule")
    warnings.filterwarnings("ignore", message=r"Optimizer\.step#")


def witness():
    """A Lightning callback that notes, from inside fit, what the model was wrapped in."""
    import pytorch_lightning as pl

    class Witness(pl.Callback):
        wrapped_in = None

        def on_train_start(self, trainer, pl_module):
            self.wrapped_in = type(trainer.strategy.model).__name__
    return Witness()


def lightning_facts(trainer, witness):
    """What a Trainer did around DDP, read from it after fit (call it inside the rank). "scripts
    launched" is the launcher's own list of the processes it started (`procs`), not a count of this
    process's children: on a GPU machine a rank has children of its own (seen on an H100, torch 2.11)."""
    env = trainer.strategy.cluster_environment
    return {"steps": trainer.global_step, "strategy": type(trainer.strategy).__name__,
            "launcher": type(trainer.strategy.launcher).__name__,
            "environment": type(env).__name__,
            "started externally": env.creates_processes_externally,
            "wrapped in": witness.wrapped_in,
            "scripts launched": len(trainer.strategy.launcher.procs)}


def profiled_ranges(trainer, prefixes=("[pl][profile]", "gloo:", "nccl:")):
    """{event name: count} of a fit run with profiler="pytorch": Lightning's ranges and the
    collectives (read from the profiler's events after fit)."""
    events = trainer.profiler.function_events or []
    counts = {}
    for e in events:
        if e.name.startswith(prefixes):
            counts[e.name] = counts.get(e.name, 0) + 1
    return counts
