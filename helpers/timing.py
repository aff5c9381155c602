"""Timing a piece of work the way the measurement conventions ask: warm-up, many runs, median."""
import statistics
import time


def sync(device=None):
    """Wait for queued GPU work (a no-op on the CPU), so a host clock reads the real end."""
    import torch

    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn, warmup=2, iters=10, device=None):
    """Seconds per call of fn(), one sample per call, after `warmup` untimed calls.

    On a GPU device each call is timed with CUDA events; elsewhere with perf_counter.
    """
    import torch

    for _ in range(warmup):
        fn()
    sync(device)
    samples = []
    cuda = device is not None and torch.device(device).type == "cuda"
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return samples


def summary(samples):
    """Median and spread (10th and 90th percentiles) of a list of timings."""
    s = sorted(samples)
    pick = lambda q: s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]  # noqa: E731
    return {"median": statistics.median(s), "p10": pick(0.1), "p90": pick(0.9), "n": len(s)}
