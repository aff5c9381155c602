"""Stand-ins for hardware a laptop lacks, wrapped around the lectures' plain code.

A GPU computes while its host's cores are free, and its collectives run as kernels on the GPU
(NCCL's, on a few SMs) while the host does other work. On a CPU, compute and communication both take
the cores, so what a GPU overlaps a laptop serialises. Two stand-ins give back what is missing, each
labelled as such wherever it is used:

- device-like compute: `device_compute(seconds)` takes time but no core (a host sleep on the CPU;
  on a GPU, torch.cuda._sleep on the current stream: the stream is busy, the host is not), and
  `DeviceLike(layer, seconds)` makes a layer's forward and backward take that much longer (lectures
  04, 05, 06, 09, 11);
- the paced link: `with paced_link(gbps, alpha_s): ...` makes every point-to-point transfer of the
  code inside take alpha_s + bytes / gbps on the ports of both ranks, on a clock that needs no core
  (lectures 02, 03, 04, 11). Each rank has one port out and one port in, each moving `gbps` GB/s: a
  message keeps the sender's out-port busy (the sender sleeps before it sends), and the receiver's
  in-port for the same time: a receive completes no earlier than the end of the previous message
  into that port plus this message's time (a root that takes K-1 messages takes them one after the
  other). The real transfer follows: the pair costs alpha_s + n/gbps + what the real transfer
  takes (the laptop's floor). A collective run over it (lecture 02's ring, a tree) pays its own
  steps, 2(K-1) alphas for a ring all-reduce included: no formula is slept. It sleeps on the host,
  so it is a gloo-only stand-in by construction and refuses NCCL. helpers.machines.Scaled gives
  the gbps and alpha_s of a modelled machine's link at a time scale.

On a GPU none of this stands for copy engines: NCCL moves a collective's bytes with kernels on the
SMs (notebooks/gpu_facts.md), so communication overlapped with compute takes SMs and memory
bandwidth from it; the series charges that as a contention range (helpers.machines), not here.
"""
import contextlib
import functools
import inspect
import time

import torch

from helpers.patching import patched


# ----------------------------------------------------------------------- device-like compute

@functools.lru_cache(maxsize=None)
def _cycles_per_second(index):
    """The GPU's clock, measured once: torch.cuda._sleep spins a number of cycles, not seconds."""
    torch.cuda.synchronize(index)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    torch.cuda._sleep(cycles)                       # first call: loads the kernel
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


# This rank's contention: compute beside a collective in flight is slowed by `share` (a GPU's SMs and
# memory bandwidth taken by NCCL's kernels: notebooks/gpu_facts.md, item 6); `busy` counts the
# collectives in flight (helpers.comm_stream marks them).
SHARED = {"share": 0.0, "busy": 0}
TICK_S = 1e-3          # how often a slowed compute looks whether a collective is still in flight


@contextlib.contextmanager
def contention(share):
    """Inside: device-like compute that runs while a collective is in flight on this rank takes
    1 + share times as long for that part (CPU stand-ins only; a GPU's kernels contend for real)."""
    before, SHARED["share"] = SHARED["share"], share
    try:
        yield
    finally:
        SHARED["share"] = before


def device_compute(seconds, device=None):
    """Take `seconds` without a CPU core: a host sleep on the CPU; on a CUDA device a kernel that
    spins that long on the current stream (the call returns at once, the stream is busy). Inside
    contention(share), the CPU's sleep progresses 1 + share times slower while a collective is in
    flight (checked every TICK_S, the time slept counted as it passed)."""
    if seconds <= 0:
        return
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda._sleep(int(seconds * _cycles_per_second(index)))
    elif not SHARED["share"]:
        time.sleep(seconds)
    else:
        left, t = seconds, time.perf_counter()
        while left > 0:
            slow = 1 + SHARED["share"] if SHARED["busy"] else 1.0
            time.sleep(min(left * slow, TICK_S))
            now = time.perf_counter()
            left, t = left - (now - t) / slow, now


class DeviceTime(torch.autograd.Function):
    """The identity that takes `forward_s` of device-like compute in forward and `backward_s` in
    backward (DeviceTime.apply(x, forward_s, backward_s))."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        ctx.backward_s = backward_s
        device_compute(forward_s, x.device)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        device_compute(ctx.backward_s, grad.device)
        return grad, None, None


class DeviceLike(torch.nn.Module):
    """`layer`, whose output comes `forward_s` later in forward and whose input's gradient comes
    `backward_s` later in backward (default: twice `forward_s`, as a layer's backward does about
    twice its forward's work), before the layer's own gradients are computed, as a GPU kernel
    would take them while the rank's cores stay free."""

    def __init__(self, layer, forward_s, backward_s=None):
        super().__init__()
        self.layer, self.forward_s = layer, forward_s
        self.backward_s = 2 * forward_s if backward_s is None else backward_s

    def forward(self, x):
        return DeviceTime.apply(self.layer(x), self.forward_s, self.backward_s)


# ------------------------------------------------------------------------------- paced link

P2P = ("send", "recv", "isend", "irecv")


class _Port:
    """One rank's in-port: when the last message into it has been through."""

    def __init__(self):
        self.free = -float("inf")

    def arrive(self, seconds):
        """The message just received took `seconds` on this port: wait until it is through."""
        now = time.perf_counter()
        due = max(self.free + seconds, now) if self.free > -float("inf") else now
        if due > now:
            time.sleep(due - now)
        self.free = max(due, now)


class _PacedWork:
    """A receive's work: waiting for it also waits for the in-port."""

    def __init__(self, work, port, seconds):
        self._work, self._port, self._seconds = work, port, seconds

    def wait(self, *args, **kwargs):
        out = self._work.wait(*args, **kwargs)
        self._port.arrive(self._seconds)
        return out

    def __getattr__(self, name):
        return getattr(self._work, name)


def _nbytes(tensor):
    return tensor.numel() * tensor.element_size()


@contextlib.contextmanager
def paced_link(gbps, alpha_s=0.0):
    """Inside: this rank's send/recv/isend/irecv (and so batch_isend_irecv) pay alpha_s + bytes /
    gbps on each port; see the module's docstring. gbps=None or 0: no pacing (the real link)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if not gbps:
        yield
        return
    if dist.get_backend() != "gloo":
        raise RuntimeError(f"the paced link sleeps on the host, which paces nothing on {dist.get_backend()}: "
                           "it is a stand-in for gloo on CPUs (run the cell with backend='gloo').")
    real = {name: getattr(c10d, name) for name in P2P}
    port = _Port()
    seconds = lambda t: alpha_s + _nbytes(t) / (gbps * 1e9)  # noqa: E731

    def isend(tensor, *args, **kwargs):
        time.sleep(seconds(tensor))                 # the out-port, one message after the other
        return real["isend"](tensor, *args, **kwargs)

    def irecv(tensor, *args, **kwargs):
        work = real["irecv"](tensor, *args, **kwargs)
        return None if work is None else _PacedWork(work, port, seconds(tensor))

    def send(tensor, *args, **kwargs):
        time.sleep(seconds(tensor))
        return real["send"](tensor, *args, **kwargs)

    def recv(tensor, *args, **kwargs):
        out = real["recv"](tensor, *args, **kwargs)
        port.arrive(seconds(tensor))
        return out

    paced = {"isend": isend, "irecv": irecv}
    # torch 2.13's send and recv call isend and irecv (c10d's own names) and wait: pacing those
    # paces them too, once. A torch whose send does not gets its send and recv paced as well.
    calls = lambda fn: inspect.unwrap(fn).__code__.co_names  # noqa: E731 - names its code uses
    if "isend" not in calls(real["send"]) or "irecv" not in calls(real["recv"]):
        paced.update(send=send, recv=recv)
    # c10d's own names too: batch_isend_irecv checks op is isend
    with patched(c10d, **paced), patched(dist, **paced):
        yield


def paced(fn, gbps, alpha_s=0.0):
    """`fn` that runs inside paced_link(gbps, alpha_s) at every call: what a harness that calls fn
    itself needs (bench.sweep({"ring, paced": ("all_reduce", paced(ring_all_reduce, 0.02))})).
    Picklable."""
    return functools.partial(_run_paced, fn, gbps, alpha_s)


def _run_paced(fn, gbps, alpha_s, *args, **kwargs):
    with paced_link(gbps, alpha_s):
        return fn(*args, **kwargs)
