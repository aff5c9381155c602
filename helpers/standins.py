"""Stand-ins for hardware a laptop lacks, wrapped around the lectures' plain code.

A GPU computes while its host's cores are free, and its links (NVLink, a NIC) move bytes with DMA
engines while the cores do other work. On a CPU, compute and communication both take cores, so what
a GPU overlaps a laptop serialises. Two stand-ins give back what is missing, each labelled as such
wherever it is used:

- device-like compute: `device_compute(seconds)` takes time but no core (a host sleep on the CPU;
  on a GPU, torch.cuda._sleep on the current stream: the stream is busy, the host is not), and
  `DeviceLike(layer, seconds)` makes a layer's forward and backward take that much longer (lectures
  04, 05, 06, 09, 11);
- the paced link: `with paced_link(gbps): ...` makes every point-to-point transfer of the code inside
  take bytes / gbps on the ports of both ranks, on a clock that needs no core (lectures 02, 11).
  Each rank has one port out and one port in, each moving `gbps` GB/s: a message keeps the
  sender's out-port busy (the sender sleeps before it sends), and the receiver's in-port for the
  same time: a receive completes no earlier than the end of the previous message into that port
  plus this message's time (a root that takes K-1 messages takes them one after the other). The
  real transfer follows: the model of the pair is 1/B = 1/gbps + 1/B_real. It sleeps on the host,
  so it is a gloo-only stand-in by construction and refuses NCCL.
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


def device_compute(seconds, device=None):
    """Take `seconds` without a CPU core: a host sleep on the CPU; on a CUDA device a kernel that
    spins that long on the current stream (the call returns at once, the stream is busy)."""
    if seconds <= 0:
        return
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda._sleep(int(seconds * _cycles_per_second(index)))
    else:
        time.sleep(seconds)


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
def paced_link(gbps):
    """Inside: this rank's send/recv/isend/irecv (and so batch_isend_irecv) pay bytes / gbps on
    each port; see the module's docstring. gbps=None or 0: no pacing (the real link)."""
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
    seconds = lambda t: _nbytes(t) / (gbps * 1e9)  # noqa: E731

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


def paced(fn, gbps):
    """`fn` that runs inside paced_link(gbps) at every call: what a harness that calls fn itself
    needs (bench.sweep({"ring, paced": ("all_reduce", paced(ring_all_reduce, 0.02))})). Picklable."""
    return functools.partial(_run_paced, fn, gbps)


def _run_paced(fn, gbps, *args, **kwargs):
    with paced_link(gbps):
        return fn(*args, **kwargs)
