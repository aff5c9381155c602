"""Lecture 04's machinery for section 4, which the lecture uses and does not teach: a paced
all-reduce (a link that costs time but no core), the ranks' timed repetitions of the lecture's
step functions, their tables and timelines, and the CPU time a collective takes (section 2's GPU
instruments are in notebooks/machinery/l04_events.py).

Every time here is the host clock (perf_counter, helpers.timing's CPU clock) read around the
lecture's step functions after a barrier.
"""
import contextlib
import functools
import statistics
import time

import torch
import torch.distributed as dist

from helpers import cost, standins, timing

# ---------------------------------------------------------------------------- section 4 (CPU)

class _PacedWork:
    """An all-reduce's work whose wait() also waits until the paced link is through."""

    def __init__(self, work, start, due, spans):
        self._work, self._start, self._due, self._spans = work, start, due, spans
        self._done = []
        self._stamp = work.get_future().then(lambda _: self._done.append(time.perf_counter()))

    def wait(self, *args, **kwargs):
        self._work.wait(*args, **kwargs)
        left = self._due - time.perf_counter()
        if left > 0:
            time.sleep(left)
        self._stamp.wait()
        if self._spans is not None:    # when the all-reduce itself ended: data and link through
            self._spans.append(("all-reduce", self._start, max(self._due, self._done[0])))
        return True

    def __getattr__(self, name):
        return getattr(self._work, name)


@contextlib.contextmanager
def paced_all_reduce(gbps, spans=None):
    """Inside: dist.all_reduce takes at least a ring's time on links of `gbps` GB/s from its call,
    2(K-1)/K x bytes / gbps (cost.ring_all_reduce), on a clock that needs no core: its work's
    wait() returns once the real all-reduce is done and that time has passed. The link carries one
    all-reduce at a time: a call made while an earlier one is on it starts when that one is
    through (two halves of a tensor take the whole one's time). The caller is free until then, as
    it would be with a GPU's link. Sleeps on the host: gloo only. `spans`: a list that gets
    ("all-reduce", start, end) per call, host clock."""
    real, free = dist.all_reduce, [0.0]     # free: when the link is through with its last call
    if dist.get_backend() != "gloo":
        raise RuntimeError("the paced all-reduce sleeps on the host: run it on gloo")

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        k = dist.get_world_size(group)
        nbytes = tensor.numel() * tensor.element_size()
        start = max(time.perf_counter(), free[0])          # when the link takes it
        due = free[0] = start + cost.ring_all_reduce(nbytes, k, gbps * 1e9)
        work = _PacedWork(real(tensor, op=op, group=group, async_op=True), start, due, spans)
        return work if async_op else work.wait()

    dist.all_reduce = all_reduce
    try:
        yield
    finally:
        dist.all_reduce = real


@functools.lru_cache(maxsize=None)
def _matrix(n=256):
    return torch.randn(n, n, generator=torch.Generator().manual_seed(0))


def matmuls(k):
    """k 256 x 256 float32 matmuls in a chain (compute that takes a core); returns the result."""
    a = c = _matrix()
    for _ in range(k):
        c = torch.tanh(c @ a)                       # tanh keeps the values bounded
    return c


class _Spanned:
    """compute(), recorded as a span on the host clock."""

    def __init__(self, compute, spans):
        self.compute, self.spans, self.last = compute, spans, None

    def __call__(self):
        t0 = time.perf_counter()
        self.last = self.compute()
        self.spans.append(("compute", t0, time.perf_counter()))
        return self.last


def overlap_rank(rank, world_size, steps, numel, ratios, repeats, gbps=None, kind="device-like"):
    """In each rank: per repetition (a barrier before each timed call), for each ratio, the
    all-reduce of `numel` float32 alone, the compute alone (ratio x the all-reduce's time:
    device_compute seconds, or that many seconds of `matmuls`), and each step of `steps`
    ({name: fn(x, compute)}) with both. gbps: the paced all-reduce (else the real one). Returns
    {"stamps": {(ratio, variant): [(seconds, spans)]}, "cpu": [share of a core], "sizes"}."""
    x = torch.empty(numel)
    total = world_size * (world_size + 1) / 2       # ranks add 1, 2, ..., K: exact in float32
    spans = []
    pacing = paced_all_reduce(gbps, spans) if gbps else contextlib.nullcontext()
    with pacing:
        for _ in range(3):
            dist.all_reduce(x)
        t_comm = statistics.median(timing.measure(lambda: dist.all_reduce(x), 1, 5))
        if gbps:
            t_comm = cost.ring_all_reduce(numel * 4, world_size, gbps * 1e9)   # the model's
        t_mm = statistics.median(timing.measure(lambda: matmuls(1), 2, 7))
        mean = torch.tensor([t_comm, t_mm], dtype=torch.float64)
        dist.all_reduce(mean)                       # every rank picks the same sizes
        t_comm, t_mm = (mean / world_size).tolist()
        if kind == "matmul":
            sizes = {r: max(1, round(r * t_comm / t_mm)) for r in ratios}
            computes = {r: functools.partial(matmuls, k) for r, k in sizes.items()}
            reference = {r: matmuls(k) for r, k in sizes.items()}
        else:
            sizes = {r: r * t_comm for r in ratios}
            computes = {r: functools.partial(standins.device_compute, s) for r, s in sizes.items()}
        variants = {"comm alone": lambda x, c: dist.all_reduce(x),
                    "compute alone": lambda x, c: c(), **steps}
        out = {"stamps": {}, "cpu": [], "sizes": sizes, "t_comm": t_comm}
        for _ in range(repeats):                    # interleaved: a change of load hits all alike
            for r in ratios:
                for variant, fn in variants.items():
                    x.fill_(rank + 1)
                    spans.clear()
                    compute = _Spanned(computes[r], spans)
                    dist.barrier()
                    c0, t0 = time.process_time(), time.perf_counter()
                    fn(x, compute)
                    t1, c1 = time.perf_counter(), time.process_time()
                    if variant == "comm alone":     # CPU time of the collective only
                        out["cpu"].append((c1 - c0) / (t1 - t0))
                    if variant != "compute alone":
                        assert torch.equal(x, torch.full_like(x, total)), "a wrong sum"
                    if kind == "matmul" and variant != "comm alone":
                        assert torch.equal(compute.last, reference[r]), "the compute changed"
                    rel = [(n, s - t0, e - t0) for n, s, e in spans]
                    out["stamps"].setdefault((r, variant), []).append((t1 - t0, rel))
    return out


def slowest(runs, key):
    """Per repetition, the slowest rank's seconds (a step is as slow as its slowest rank)."""
    return [max(t for t, _ in reps) for reps in zip(*(run["stamps"][key] for run in runs))]


def step_rows(runs, model_s=None):
    """One row per ratio of overlap_rank's runs: the medians (ms, slowest rank per repetition) of
    every variant and their ratio compute / comm, the ideal max(comm, compute) of the measured
    medians, overlapped minus ideal, the series' overlap ((comm + compute - overlapped) / comm,
    CONTRIBUTING.md), the spreads over the repetitions of the overlapped step and of the longer
    piece alone, and whether they overlap (the difference is then not distinguishable here);
    with model_s (the paced all-reduce's time), the models' comm and compute."""
    keys = list(runs[0]["stamps"])
    variants = list(dict.fromkeys(v for _, v in keys))
    rows = []
    for r in sorted({r for r, _ in keys}):
        med = {v: statistics.median(slowest(runs, (r, v))) * 1e3 for v in variants}
        over = [t * 1e3 for t in slowest(runs, (r, "overlapped"))]
        s, label = timing.summary(over), timing.spread_label(len(over))
        longer = max(("comm alone", "compute alone"), key=med.get)
        ideal, p = med[longer], timing.summary([t * 1e3 for t in slowest(runs, (r, longer))])
        row = {"ratio": r, "measured ratio": med["compute alone"] / med["comm alone"],
               **{v.replace(" alone", "") + " ms": m for v, m in med.items()},
               "ideal ms": ideal, "overlapped - ideal": med["overlapped"] - ideal,
               "overlap": (med["comm alone"] + med["compute alone"] - med["overlapped"])
               / med["comm alone"],
               f"overlapped {label}": f"{s['p10']:.1f}-{s['p90']:.1f}",
               f"ideal {label}": f"{p['p10']:.1f}-{p['p90']:.1f}",
               "spreads overlap": s["p10"] <= p["p90"] and p["p10"] <= s["p90"]}
        if model_s:
            row.update({"comm model ms": model_s * 1e3, "compute model ms": r * model_s * 1e3})
        rows.append(row)
    return rows


def median_timeline(runs, key, lanes=("all-reduce", "compute")):
    """The repetition whose slowest rank took the median time: (one list of timeline.draw's
    events per rank and lane, in ms since the rank's step began; the lanes' labels)."""
    times = slowest(runs, key)
    i = sorted(range(len(times)), key=times.__getitem__)[len(times) // 2]
    events, labels = [], []
    for rank, run in enumerate(runs):
        for lane in lanes:
            events.append([{"name": n, "start": s * 1e3, "end": e * 1e3}
                           for n, s, e in run["stamps"][key][i][1] if n == lane])
            labels.append(f"rank {rank}: {lane}")
    return events, labels


def cpu_shares(runs):
    """Per rank: the share of one core its process used while its all-reduce ran alone (process
    CPU time, every thread, over wall time, around the call only), median and spread over
    repetitions, as text; and the medians."""
    out, medians = [], []
    for run in runs:
        s = timing.summary(run["cpu"])
        out.append(f"{s['median']:.0%} ({timing.spread_label(s['n'])} "
                   f"{s['p10']:.0%}-{s['p90']:.0%}, {s['n']} calls)")
        medians.append(s["median"])
    return out, medians


def spare_core_runs(runs):
    """[(run, its optional-section rows)] of the kept runs (archive.runs) whose host had cores to
    spare: at least two a rank (a matmul thread and gloo's work)."""
    return [(r, r["measurements"]["cpu_cores"]) for r in runs if r["measurements"].get("cpu_cores")
            and r["machine"]["cores"] >= 2 * r["measurements"]["world_size"]]
