"""A collective's own stream on CPU ranks: the lecture's algorithm run over the paced link by one
thread per rank, so that `dist.all_reduce(x, async_op=True)` returns at once and the caller's
compute runs meanwhile, as a GPU's compute runs beside NCCL's stream.

    from course.ring_math import ring_all_reduce            # lecture 02's ring
    with comm_stream.paced(ring_all_reduce, *h100.link()):  # inside a rank (gloo)
        work = dist.all_reduce(grad, async_op=True)         # the ring starts on the comm thread
        compute()                                           # device-like compute, beside it
        work.wait()                                         # the sum is in grad

Inside, every dist.all_reduce (sum, whole world) is `algorithm(tensor)` run on the rank's comm
thread (and, given `all_gather`, every dist.all_gather_single is `all_gather(output, input)`),
one call after the other in the order they were made (one link, as one NCCL stream), over
standins.paced_link(gbps, alpha_s): its time is its own steps', 2(K-1) alphas of a ring included,
not a formula. While a call is in flight the rank's `standins.SHARED["busy"]` is set, so device-like
compute under standins.contention(share) slows down meanwhile. `stream.calls` logs each call's
bytes, start and end on perf_counter. A gloo-only stand-in (the paced link sleeps on the host).
The kit holds the mechanism; the algorithm is the lecture's, passed in.
"""
import contextlib
import queue
import threading
import time

import torch.distributed as dist

from helpers import standins
from helpers.patching import patched


class Work:
    """What all_reduce returns: wait() blocks until the call ran (and raises what it raised)."""

    def __init__(self):
        self._done, self._error = threading.Event(), None

    def wait(self, timeout=None):
        if not self._done.wait(timeout):
            raise TimeoutError("the collective on the comm thread did not finish in time")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self):
        return self._done.is_set()


class Stream:
    """One thread that runs the queued calls in order; `calls` is the log of what it ran."""

    def __init__(self):
        self.jobs, self.calls = queue.Queue(), []
        self.thread = threading.Thread(target=self._run, daemon=True, name="comm-stream")
        self.thread.start()

    def _run(self):
        while True:
            job = self.jobs.get()
            if job is None:
                return
            fn, work, call = job
            standins.SHARED["busy"] += 1
            call["start"] = time.perf_counter()
            try:
                fn()
            except BaseException as e:      # handed to the caller's wait()
                work._error = e
            finally:
                call["end"] = time.perf_counter()
                standins.SHARED["busy"] -= 1
                work._done.set()

    def submit(self, fn, nbytes):
        work, call = Work(), {"nbytes": nbytes, "queued": time.perf_counter()}
        self.calls.append(call)
        self.jobs.put((fn, work, call))
        return work

    def close(self):
        self.jobs.put(None)
        self.thread.join()


@contextlib.contextmanager
def paced(algorithm, gbps, alpha_s=0.0, all_gather=None):
    """Inside (a rank, gloo): dist.all_reduce runs `algorithm(tensor)` on this rank's comm thread
    over paced_link(gbps, alpha_s), and, given `all_gather(output, input)`, so does
    dist.all_gather_single, on the same thread; yields the Stream (its `calls`)."""
    if dist.get_backend() != "gloo":
        raise RuntimeError("the comm stream's paced link sleeps on the host: a stand-in for gloo only")
    stream = Stream()

    def whole_world(op, group):
        if op != dist.ReduceOp.SUM or group not in (None, dist.group.WORLD):
            raise NotImplementedError("the comm stream runs a sum over the whole world only")

    def run(fn, nbytes, async_op):
        work = stream.submit(fn, nbytes)
        if async_op:
            return work
        work.wait()
        return None

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        whole_world(op, group)
        return run(lambda: algorithm(tensor), tensor.numel() * tensor.element_size(), async_op)

    def all_gather_single(output, input, group=None, async_op=False):
        whole_world(dist.ReduceOp.SUM, group)
        return run(lambda: all_gather(output, input), output.numel() * output.element_size(),
                   async_op)

    replaced = dict(all_reduce=all_reduce)
    if all_gather is not None:
        replaced["all_gather_single"] = all_gather_single
    try:
        with standins.paced_link(gbps, alpha_s), patched(dist, **replaced):
            yield stream
    finally:
        stream.close()
