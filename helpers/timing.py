"""Timing work the way the measurement conventions ask: warm-up, many runs, median (measure), and
timestamps on one axis that are right on both backends (Clock)."""
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


def _rank(q, n):
    """The index of the q-quantile of n sorted samples, nearest rank (numpy's "nearest")."""
    return min(n - 1, int(q * (n - 1) + 0.5))


def summary(samples):
    """Median and spread (10th and 90th percentiles, nearest rank) of a list of timings. With 5
    samples or fewer those are the smallest and the largest sample: spread_label says which."""
    s = sorted(samples)
    return {"median": statistics.median(s), "p10": s[_rank(0.1, len(s))],
            "p90": s[_rank(0.9, len(s))], "n": len(s)}


def floor(rounds):
    """The laptop's floor from `rounds` (seconds) of some work on an unpaced link: {"least": the
    least round, "spread": from it to the median}. Load and the laptop's scheduling add to a
    round and never take one away (an unpaced gloo exchange here now and then takes ~5 ms more,
    in runs of rounds), so the least round is the floor and the rest its spread."""
    least = min(rounds)
    return {"least": least, "spread": statistics.median(rounds) - least}


def above_floor(measured, floor_rounds, floor_model=0.0):
    """What rounds `measured` (seconds, on the model) take above the floor of `floor_rounds`
    (the same work on an unpaced link, which the model says takes `floor_model`): {"median":
    measured's median less the floor's least round, "tolerance", "floor": that least round}.
    The tolerance is measured's spread (p10-p90), the floor's, and the floor's least round
    beyond its model: how much of the laptop's own time a paced round keeps (its real
    transfers run while the paced link sleeps, or after) is not known, from none to all."""
    m, f = summary(measured), floor(floor_rounds)
    beyond = max(f["least"] - floor_model, 0.0)
    return {"median": m["median"] - f["least"],
            "tolerance": m["p90"] - m["p10"] + f["spread"] + beyond, "floor": f["least"]}


def spread_label(n):
    """What summary()'s p10-p90 of n samples is: "min-max" where both are the extremes (n <= 5),
    else "p10-p90"."""
    return "min-max" if _rank(0.1, n) == 0 and _rank(0.9, n) == n - 1 else "p10-p90"


class Clock:
    """Timestamps of a rank's timeline, right on the CPU and on a GPU.

        clock = Clock(device)            # the rank's device (cuda under NCCL, cpu under gloo)
        clock.now("start")               # the work queued so far is done
        work = dist.all_reduce(x, async_op=True)
        clock.done("all-reduce", work)   # when the collective itself finishes
        y = compute(); clock.now("compute")
        work.wait()
        t = clock.read()                 # {"start": 0.0, "all-reduce": s, "compute": s}, seconds

    On the CPU, now() reads perf_counter (gloo's calls and CPU kernels are finished when they return)
    and done() stamps from a callback on the work's future, which gloo's thread runs on completion.
    On a GPU a host clock reads launches, and NCCL completes a work's future when the collective is
    queued, so both would be wrong: now() records a CUDA event on the current stream (it completes
    once the work queued before it on that stream has run), and done() records one on a fresh side
    stream made to wait for the collective by work.wait() (wait() orders the *current* stream after
    the collective, on the device, without blocking the host): that event neither waits for the
    compute queued after it nor holds it up. read() synchronizes once, then reads every event.
    Keys must be unique; a key may be any hashable (("forward", 3), ...).
    """

    def __init__(self, device=None):
        import torch

        self.cuda = device is not None and torch.device(device).type == "cuda"
        self.stamps, self.pending = {}, []

    def now(self, key):
        import torch

        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.stamps[key] = event
        else:
            self.stamps[key] = time.perf_counter()

    def done(self, key, work):
        import torch

        if self.cuda:
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                work.wait()
                event = torch.cuda.Event(enable_timing=True)
                event.record(side)
            self.stamps[key] = event
        else:
            stamps = self.stamps
            self.pending.append(work.get_future().then(lambda _: stamps.setdefault(key, time.perf_counter())))

    def read(self):
        """{key: seconds since the earliest stamp}. Call it once the work is done (after work.wait())."""
        import torch

        for future in self.pending:  # the callbacks have run (they may lag the work's own completion)
            future.wait()
        self.pending.clear()
        if not self.stamps:
            return {}
        if self.cuda:
            torch.cuda.synchronize()
            events = list(self.stamps.items())
            times = {k: events[0][1].elapsed_time(e) / 1e3 for k, e in events}
        else:
            times = dict(self.stamps)
        origin = min(times.values())
        return {k: t - origin for k, t in times.items()}
