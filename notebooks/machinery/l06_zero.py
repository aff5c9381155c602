"""Lecture 06's measuring machinery (ZeRO): the bytes a rank holds, a paced all-gather and a
forward timeline. It wraps the lecture's plain code (course.zero) and torch's FSDP2 from outside:

    held = zero_bench.optimizer_held(model, opt) # after backward, before opt.step()
    with zero_bench.paced_gather(0.01) as link:  # every all-gather takes 10 ms more on the link
        events = zero_bench.forward_events(model, x)

- bytes held: the storages behind a set of tensors, each storage once (a view counts once);
- the paced all-gather: `dist.all_gather_single` inside the context completes no earlier than
  `seconds` after the link is free (one gather at a time on the link, a clock that needs no core:
  the host sleeps in wait()), as a GPU's all-gather runs as NCCL's kernel on a few SMs while the
  host computes (overlap on a GPU takes SMs from compute: notebooks/gpu_facts.md, item 6);
  the real gather is issued at once and runs inside that time (a gather is done at the later of
  the two; microseconds here). A gloo-only stand-in, like standins.paced_link;
- the forward timeline: each unit's forward as a span (forward hooks, helpers.timeline.Recorder),
  and each gather's time on the link, on one perf_counter axis;
- the peak: the bytes of the storages created and alive at once (PeakBytes, peak_bytes), under
  gloo inside caller_owned_collectives(), where the caller's frees, not gloo's thread, time them;
  assert_zero3_peak holds a ZeRO-3 step's peak to its model (the lecture and its test use it).
"""
import contextlib
import functools
import time
import weakref

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from helpers.patching import patched
from helpers.timeline import Recorder


def storage_bytes(tensors):
    """Bytes of memory behind `tensors`: each storage once (views share it), None counts 0."""
    storages = {}
    for t in tensors:
        if t is not None:
            s = t.untyped_storage()
            storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def _optim_state(optim):
    """The optimizer's state tensors, without AdamW's one-element `step` counters."""
    return [t for state in optim.state.values() for k, t in state.items() if k != "step"]


def optimizer_held(model, opt):
    """Bytes one rank holds with course.zero's ZeroOptimizer / Zero2Optimizer (`model` unused:
    the optimizer knows its parameters; the signature is units_held's): the model's
    parameters, its gradients (full ones and reduced slices) and the optimizer state (the master
    slices and their Adam moments)."""
    return {"params": storage_bytes(opt.params),
            "grads": storage_bytes([p.grad for p in opt.params] + opt.grads),
            "optim": storage_bytes(opt.shards + _optim_state(opt.optim))}


def units_held(model, optim):
    """Bytes one rank holds with course.zero's ShardedUnit layers: the fp32 shards (the master
    copy, gathered in param_dtype only while used), their gradients, the optimizer state."""
    shards = [p for p in model.parameters()]
    return {"params": storage_bytes(shards), "grads": storage_bytes(p.grad for p in shards),
            "optim": storage_bytes(_optim_state(optim))}


def fsdp_held(model, optim):
    """The same for FSDP2 (fully_shard): the DTensors' local shards, their gradients, the state."""
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
    params = list(model.parameters())
    return {"params": storage_bytes(local(p) for p in params),
            "grads": storage_bytes(local(p.grad) for p in params if p.grad is not None),
            "optim": storage_bytes(local(t) for t in _optim_state(optim))}


class _DueWork:
    """An all-gather's work that is done no earlier than `due` (a perf_counter time)."""

    def __init__(self, work, due):
        self.work, self.due = work, due

    def wait(self, *args, **kwargs):
        self.work.wait(*args, **kwargs)
        delay = self.due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return True


class PacedGather:
    """The link of paced_gather: when it is free, and each gather's (start, end) on it."""

    def __init__(self, seconds):
        self.seconds, self.free, self.busy = seconds, 0.0, []

    def events(self, origin):
        return [{"name": "all-gather", "start": a - origin, "end": b - origin}
                for a, b in self.busy]


@contextlib.contextmanager
def paced_gather(seconds):
    """Inside: dist.all_gather_single takes `seconds` on a link of its own (see the docstring)."""
    if dist.get_backend() != "gloo":
        raise RuntimeError("paced_gather sleeps on the host: a stand-in for gloo on CPUs.")
    real, link = dist.all_gather_single, PacedGather(seconds)

    def gather(output, input, group=None, async_op=False):
        start = max(link.free, time.perf_counter())
        link.free = start + link.seconds
        link.busy.append((start, link.free))
        work = _DueWork(real(output, input, group=group, async_op=True), link.free)
        return work if async_op else work.wait()

    dist.all_gather_single = gather
    try:
        yield link
    finally:
        dist.all_gather_single = real


def forward_events(model, x, layers, link=None):
    """One forward of `model`: the forward of each module of `layers` as a span of a
    timeline.Recorder, and the link's gathers (this forward's only), in seconds since the
    forward began."""
    rec, spans, hooks = Recorder(), {}, []
    if link is not None:
        link.busy.clear()
    for i, unit in enumerate(layers):
        def pre(module, args, i=i):
            spans[i] = rec.span(f"layer {i}")
            spans[i].__enter__()

        def post(module, args, out, i=i):
            spans.pop(i).__exit__(None, None, None)
        hooks += [unit.register_forward_pre_hook(pre), unit.register_forward_hook(post)]
    origin = time.perf_counter()
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    compute = rec.events(origin=origin)
    return compute, (link.events(origin) if link is not None else [])


class PeakBytes(TorchDispatchMode):
    """A dispatch mode: the bytes of the storages created inside it that are alive at once,
    now and at the peak (each storage once; a view of an input's storage is not new). What
    existed before the mode (the held shards, the optimizer state) is not counted, so `peak`
    is the peak above what was held. Thread-local, like helpers.trace.calls(); under gloo
    measure inside caller_owned_collectives(), or a buffer's free is timed by gloo's thread."""

    def __init__(self):
        super().__init__()
        self.refs, self.now, self.peak = WeakIdKeyDictionary(), 0, 0

    def _free(self, nbytes, _ref):
        self.now -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            s = t.untyped_storage()
            if s in self.refs or s.data_ptr() in inputs or s.nbytes() == 0:
                continue
            self.refs[s] = weakref.ref(s, functools.partial(self._free, s.nbytes()))
            self.now += s.nbytes()
            self.peak = max(self.peak, self.now)
        return out


class _Done:
    """The work of a collective that has run to completion already."""

    def wait(self, *args, **kwargs):
        return True

    def is_completed(self):
        return True


@contextlib.contextmanager
def caller_owned_collectives():
    """Inside: dist.all_gather_single and dist.reduce_scatter_single run at once (async_op
    gives a finished work) on copies made outside any PeakBytes, and copy the result into the
    caller's output: gloo then holds none of the caller's tensors, and each is freed when the
    caller drops it. Without this a finished collective's input and output outlive their last
    use by a scheduling delay: ProcessGroupGloo::runLoop's worker keeps the work (which holds
    them) until it re-takes its queue's lock after completing the future that wait() returns
    on, and it frees their storages (which have Python objects) only once it has the GIL. A
    ZeRO-3 step's peak moved by a gathered unit and its input (1.5 units) between runs, the
    free done on the thread "pt_gloo_runloop"; even with async_op=False."""
    from torch.utils._python_dispatch import _disable_current_modes
    real = {name: getattr(dist, name) for name in ("all_gather_single", "reduce_scatter_single")}

    def owned(name):
        def collective(output, input, *args, async_op=False, **kwargs):
            with _disable_current_modes():         # gloo's copies: not the caller's bytes
                out, inp = torch.empty_like(output), input.clone()
                real[name](out, inp, *args, **kwargs)
                output.copy_(out)
            return _Done() if async_op else None
        return collective

    with patched(dist, **{name: owned(name) for name in real}):
        yield

def draw_forward(ax, compute, gathers, legend=True):
    """One rank's forward_events on two rows (compute, link), each gather's bar labelled
    "AG i" (the unit it gathers, in issue order) and each layer's "L i"."""
    from helpers import timeline
    timeline.draw(ax, [compute, gathers], label=legend)
    for row, events, tag in ((0, compute, "L"), (1, gathers, "AG")):
        for i, e in enumerate(events):
            ax.text((e["start"] + e["end"]) / 2, row, f"{tag} {i}", ha="center",
                    va="center", fontsize=7, color="white")
    ax.set_yticks([0, 1], ["compute", "link"])


def peak_bytes(fn):
    """Bytes above what was held at the call, at the peak of `fn()` (PeakBytes); what fn
    returns stays alive to the end (a forward's output keeps its saved activations)."""
    with PeakBytes() as mode:
        fn()
    return mode.peak


def assert_zero3_peak(peak, numel, n, saved, p=2, r=4):
    """A ZeRO-3 step's `peak` (peak_bytes inside caller_owned_collectives, above what a rank
    holds: its shards and their gradients) against its model, for units of `numel` parameters
    each (padded here to N, a multiple of n), p bytes a param_dtype value, r a reduce_dtype one,
    and `saved` activation values autograd keeps (in param_dtype, A = saved p bytes): at least
    A + G, G = N p one gathered unit (a step must gather one), at most A + 2G (this unit's and
    the next's) plus the backward's transients: the unit's flat gradient (N p), its cast to
    reduce_dtype (N r; none when r's dtype is p's, an upper bound then) and the reduced slice
    (N r / n). A unit that keeps what it gathers adds G a gather, 2G a layer a step: above it
    from a few layers on. Returns the bounds (lo, hi) in bytes."""
    numel = -(-numel // n) * n
    gathered, acts = numel * p, saved * p
    transients = numel * p + numel * r + numel // n * r
    lo, hi = acts + gathered, acts + 2 * gathered + transients
    assert lo <= peak, ("below one gathered unit", peak, lo)
    assert peak <= hi, ("more than two gathered units and the gradient's buffers", peak, hi)
    return lo, hi
