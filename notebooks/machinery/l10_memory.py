"""Memory instruments of lecture 10 (activations, recomputation), and its key measured claim.

    with memory_bench.LiveBytes() as live:       # every storage allocated inside, while it lives
        out = block(x); live.mark("kept")        # bytes still alive after the forward
        out.sum().backward()
    live.marks["kept"], live.peak                # what the forward left, the step's high-water mark

    got = memory_bench.step_memory(lambda: block(x), device)   # {"kept", "peak"}; + "cuda peak" on a GPU
    memory_bench.assert_saved(measured, model)   # the claim: saved bytes == formula, every point

`LiveBytes` is a TorchDispatchMode: every aten operator that runs inside it (the backward too: autograd
carries the mode into its engine) is seen with its outputs; an output whose storage is new (not one
of the operator's inputs' storages: a view, or an in-place result, allocates nothing) is counted
from its allocation until its storage is freed (a weakref finalizer). It sees only what operators
return: memory a kernel allocates for itself and frees before returning (a CPU flash kernel's
per-thread buffers, oneDNN's scratch, cuBLAS's workspace) is invisible, so its peak is a lower
bound. It counts storages' bytes as torch asks for them; CUDA's caching allocator rounds each block up to a multiple of 512 bytes and
keeps freed blocks for reuse, so on a GPU `torch.cuda.max_memory_allocated()` (the allocator's own
high-water mark, read after `reset_peak_memory_stats`, minus what was allocated before) is the
device's number and reads at least LiveBytes' peak; `step_memory` reads both there, after one
warm-up step (the first matmul of a process allocates cuBLAS's workspace, 8-32 MiB, kept for
good: without the warm-up it would land in the first measured step's peak).

The key claim (notebooks/10_memory_precision.ipynb, sections 1-2, `assert_saved`): the bytes that
autograd saves for one transformer block, counted by the lecture's saved-tensor hook, equal its
formula to the byte at every (dtype, s, b) measured: (16 sbh + a s^2 b + 4 sb) E + s^2 for the
explicit softmax, 16 sbh E + a s b E_lse + 4 sb E for F.scaled_dot_product_attention. Counts do not
depend on load. The negative controls (tests/test_lecture_10.py): the SDPA block against the
explicit formula (a model off by the a s^2 b term), and a counter that misses a tensor, must fail.
"""
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _storages(tree):
    return [t.untyped_storage() for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages operators return inside the `with` block and still alive: `live` now,
    `peak` the most at once (a lower bound: a kernel's internal buffers are not seen), `marks[name]`
    what `mark(name)` read. `device`: count only that device type."""

    def __init__(self, device=None):
        super().__init__()
        self.device = None if device is None else torch.device(device).type
        self.live, self.peak, self.marks, self._alive = 0, 0, {}, set()

    def _free(self, key, n):
        self._alive.discard(key)
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {st.data_ptr() for st in _storages((args, kwargs))}
        for st in _storages(out):
            key, n = st.data_ptr(), st.nbytes()
            if (n and key not in inputs and key not in self._alive
                    and (self.device is None or st.device.type == self.device)):
                self._alive.add(key)
                self.live += n
                weakref.finalize(st, self._free, key, n)
        self.peak = max(self.peak, self.live)
        return out

    def mark(self, name):
        self.marks[name] = self.live


def step_memory(forward, inputs, device="cpu"):
    """Run forward() and the gradients of its output's sum with respect to `inputs` (returned
    fresh, not accumulated, so every run allocates the same). Returns {"kept": bytes alive
    after the forward (what it saved, its output), "peak": the most alive at once}, counted by
    LiveBytes; on a GPU also the allocator's: "cuda kept", "cuda peak" (memory_allocated and
    max_memory_allocated minus what was allocated before the forward), after one warm-up step."""
    cuda = torch.device(device).type == "cuda"
    if cuda:                  # warm-up: workspaces and first-call buffers before the baseline
        torch.autograd.grad(forward().float().sum(), list(inputs))
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    with LiveBytes(device) as live:
        out = forward()
        live.mark("kept")
        cuda_kept = torch.cuda.memory_allocated(device) - before if cuda else None
        grads = torch.autograd.grad(out.float().sum(), list(inputs))
        del out, grads
    got = {"kept": live.marks["kept"], "peak": live.peak}
    if cuda:
        torch.cuda.synchronize(device)
        got.update({"cuda kept": cuda_kept,
                    "cuda peak": torch.cuda.max_memory_allocated(device) - before})
    return got


class SaveLog:
    """Bytes handed to a saved-tensor pack hook, each save counted (a storage saved twice is
    copied twice by an offload hook): `activations`, and `weights` (saves of parameters).

        log = SaveLog(model.parameters())
        with log.around(torch.autograd.graph.save_on_cpu(pin_memory=True)):
            model(x)
    """

    def __init__(self, params=()):
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.activations = self.weights = 0

    def around(self, hooks):
        def pack(t):
            n = t.numel() * t.element_size()
            if t.untyped_storage().data_ptr() in self.params:
                self.weights += n
            else:
                self.activations += n
            return hooks.pack_hook(t)
        return torch.autograd.graph.saved_tensors_hooks(pack, hooks.unpack_hook)


def record_saves(run, params=()):
    """[(shape, bytes)] of each storage autograd saves for backward while `run()` executes, in the
    order first saved: the storages the lecture's SavedBytes counts (each once, the parameters in
    `params` left out), tensor by tensor, each named by the shape it was first saved as."""
    from course.memory_precision import SavedBytes

    shapes = {}

    class Shaped(SavedBytes):
        def pack(self, t):
            shapes.setdefault(t.untyped_storage().data_ptr(), tuple(t.shape))
            return super().pack(t)

    with Shaped(params) as saved:
        out = run()              # alive until recorded: no saved storage is freed and reused
    del out
    return [(" x ".join(map(str, shapes[ptr])), n) for ptr, n in saved.storages.items()]


def assert_saved(measured, model):
    """The lecture's key claim: measured[point] == model[point] bytes at every point, exactly (the
    formula lists every tensor autograd saves; there is nothing to tolerate)."""
    assert measured.keys() == model.keys(), (sorted(measured), sorted(model))
    wrong = {p: (measured[p], model[p]) for p in measured if measured[p] != model[p]}
    assert not wrong, (f"{len(wrong)} of {len(measured)} points differ from the formula "
                       f"(point: measured, formula): {dict(list(wrong.items())[:3])}")


def assert_peak_model(kept, peak, transient_low, transient_high):
    """The backward's transient buffers: peak - kept within [low, high] bytes (the model's range)."""
    extra = peak - kept
    assert transient_low <= extra <= transient_high, (
        f"the backward's peak is {extra} bytes above what the forward kept, outside the model's "
        f"[{transient_low}, {transient_high}]")


def interleaved(calls, rounds, device="cpu"):
    """{name: timing.summary} of each call in `calls` ({name: fn}), one sample per round, the
    calls taken in turn in every round so that a slow spell of the machine hits them all; on the
    CPU with one thread (no wait for a second thread that other work holds), CUDA events on a GPU."""
    from helpers import timing

    threads = torch.get_num_threads()
    if torch.device(device).type == "cpu":
        torch.set_num_threads(1)
    try:
        for fn in calls.values():
            timing.measure(fn, warmup=2, iters=1, device=device)
        samples = {name: [] for name in calls}
        for _ in range(rounds):
            for name, fn in calls.items():
                samples[name] += timing.measure(fn, warmup=0, iters=1, device=device)
    finally:
        torch.set_num_threads(threads)
    return {name: timing.summary(v) for name, v in samples.items()}
