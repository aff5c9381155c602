"""Lecture 06's measuring machinery (ZeRO): the bytes a rank holds, the all-gather on the H100
model and a forward timeline. It wraps the lecture's plain code (course.zero) and torch's FSDP2
from outside:

    held = zero_bench.optimizer_held(model, opt) # after backward, before opt.step()
    with zero_bench.on_model(h100, share) as stream:   # every all-gather: the model's ring
        events = zero_bench.forward_events(model, x, layers, stream.calls)

- bytes held: the storages behind a set of tensors, each storage once (a view counts once);
- the all-gather on the H100 model: `dist.all_gather_single` inside the context is lecture 02's
  ring all-gather over the scaled model's paced link, run on the rank's comm stream
  (helpers.comm_stream), as NCCL's kernel runs on a few SMs while the host computes; device-like
  compute beside it is slowed by the contention share (notebooks/gpu_facts.md, item 6). A
  gloo-only stand-in, like standins.paced_link;
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
from machinery import l05_ddp as ddp_bench


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


def ring_all_gather_single(output, input):
    """dist.all_gather_single(output, input) as lecture 02's ring all-gather: each rank's input
    goes to its slice of output, then the ring passes the slices round."""
    from course.ring_math import ring_all_gather

    chunks = list(output.chunk(dist.get_world_size()))
    chunks[dist.get_rank()].copy_(input)
    ring_all_gather(chunks)


def on_model(scaled, share=0.0):
    """Inside (a rank, gloo): every dist.all_gather_single is lecture 02's ring all-gather
    (ring_all_gather_single) on lecture 05's H100 model (ddp_bench.on_model: the scaled paced
    link, the comm stream, the contention `share`; None: unpaced). Yields the stream."""
    return ddp_bench.on_model(scaled, share, all_gather=ring_all_gather_single)


def forward_events(model, x, layers, calls=()):
    """One forward of `model`: the forward of each module of `layers` as a span of a
    timeline.Recorder, and the gathers this forward added to `calls` (a comm stream's log), in
    seconds since the forward began."""
    rec, spans, hooks, first = Recorder(), {}, [], len(calls)
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
    gathers = [{"name": "all-gather", "start": c["start"] - origin, "end": c["end"] - origin}
               for c in list(calls)[first:]]
    return rec.events(origin=origin), gathers


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


def timed_forwards(model, x, layers, scaled, share, rounds):
    """In a rank: `rounds` forwards of `model` on the scaled model (on_model), each followed by
    one on an unpaced link (the floor), after a barrier each. Returns ({True: on the model,
    False: unpaced} seconds of each round's forward, the last round's forward_events on the
    model)."""
    times = {True: [], False: []}
    for _ in range(rounds):
        for paced in (True, False):
            with on_model(scaled if paced else None, share) as link:
                dist.barrier()
                compute, gathers = forward_events(model, x, layers, link.calls)
            times[paced].append(compute[-1]["end"])
            if paced:
                events = compute, gathers
    return times, events


def draw_forwards(runs, title):
    """Rank 0's last forward of each schedule ({prefetch: spawn results of timed_forwards}), one
    axis each, compute and link (draw_forward)."""
    from helpers import plots
    fig, axes = plots.figure(nrows=len(runs), width=10, height=3.6, sharex=True)
    for ax, (p, res) in zip(axes, runs.items()):
        draw_forward(ax, *res[0][1], legend=ax is axes[0])
        ax.set_title(f"prefetch={p}: rank 0, last round {title}", fontsize=9)
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    axes[0].set_xlabel("")
    return fig
