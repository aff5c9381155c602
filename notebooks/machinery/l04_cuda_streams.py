"""Lecture 04's machinery for section 4, which the lecture uses and does not teach: the ranks'
timed repetitions of the lecture's step functions on the H100 model (lecture 02's ring over the
paced link on a comm thread of its own, helpers.comm_stream; device-like compute slowed while the
ring runs, standins.contention) or on the real gloo all-reduce beside real matmuls (the optional
section), their tables and timelines, and the CPU time a collective takes (section 2's GPU
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

from helpers import comm_stream, standins, timing

# ---------------------------------------------------------------------------- section 4 (CPU)


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


def _computes(kind, sizes, t_comm):
    """{label: compute()}: device-like compute of `sizes` seconds, or (kind "matmul", sizes the
    ratios to the all-reduce's measured time) chains of matmuls; and their reference results."""
    if kind != "matmul":
        return {r: functools.partial(standins.device_compute, s) for r, s in sizes.items()}, {}
    t_mm = statistics.median(timing.measure(lambda: matmuls(1), 2, 7))
    mean = torch.tensor([t_mm], dtype=torch.float64)
    dist.all_reduce(mean)                           # every rank picks the same sizes
    k = {r: max(1, round(r * t_comm / (mean.item() / dist.get_world_size()))) for r in sizes}
    return ({r: functools.partial(matmuls, n) for r, n in k.items()},
            {r: matmuls(n) for r, n in k.items()})


def overlap_rank(rank, world_size, steps, numel, sizes, repeats, link=None, shares=(0.0,),
                 kind="device-like"):
    """In each rank: per repetition (a barrier before each timed call), for each contention share,
    for each compute of `sizes` ({label: seconds of device-like compute}; kind "matmul": {ratio:
    ratio} of matmuls to the all-reduce's measured time), the all-reduce of `numel` float32 alone,
    the compute alone, and each step of `steps` ({name: fn(x, compute)}) with both. link: (gbps,
    alpha_s) of a scaled model (helpers.machines.Scaled.link): every all-reduce is lecture 02's
    ring over that paced link on the comm thread; None: gloo's own. Returns {"stamps": {(label,
    share, variant): [(seconds, spans)]}, "cpu": [share of a core], "t_comm"}."""
    from course.ring_math import ring_all_reduce

    x = torch.empty(numel)
    total = world_size * (world_size + 1) / 2       # ranks add 1, 2, ..., K: exact in float32
    spans = []
    stream = comm_stream.paced(ring_all_reduce, *link) if link else contextlib.nullcontext()
    with stream as s:
        for _ in range(3):
            dist.all_reduce(x)
        t_comm = statistics.median(timing.measure(lambda: dist.all_reduce(x), 1, 5))
        computes, reference = _computes(kind, sizes, t_comm)
        variants = {"comm alone": lambda x, c: dist.all_reduce(x),
                    "compute alone": lambda x, c: c(), **steps}
        out = {"stamps": {}, "cpu": [], "t_comm": t_comm}
        for _ in range(repeats):                    # interleaved: a change of load hits all alike
            for share in shares:
                with standins.contention(share):
                    for r in computes:
                        for variant, fn in variants.items():
                            x.fill_(rank + 1)
                            spans.clear()
                            compute = _Spanned(computes[r], spans)
                            first = len(s.calls) if s else 0
                            dist.barrier()
                            c0, t0 = time.process_time(), time.perf_counter()
                            fn(x, compute)
                            t1, c1 = time.perf_counter(), time.process_time()
                            if variant == "comm alone":     # CPU time of the collective only
                                out["cpu"].append((c1 - c0) / (t1 - t0))
                            if variant != "compute alone":
                                assert torch.equal(x, torch.full_like(x, total)), "a wrong sum"
                            if reference and variant != "comm alone":
                                assert torch.equal(compute.last, reference[r]), "the compute changed"
                            calls = s.calls[first:] if s else []
                            rel = [(n, a - t0, e - t0) for n, a, e in spans] + \
                                [("all-reduce", c["start"] - t0, c["end"] - t0) for c in calls]
                            out["stamps"].setdefault((r, share, variant), []).append((t1 - t0, rel))
    return out


def slowest(runs, key):
    """Per repetition, the slowest rank's seconds (a step is as slow as its slowest rank)."""
    return [max(t for t, _ in reps) for reps in zip(*(run["stamps"][key] for run in runs))]


def step_rows(runs, comm_model_s=None, compute_model_s=None, label="ratio"):
    """One row per (compute, contention share) of overlap_rank's runs: the medians (ms, slowest
    rank per repetition) of every variant and their ratio compute / comm, the ideal max(comm,
    compute) of the measured medians, overlapped minus ideal, the series' overlap ((comm + compute
    - overlapped) / comm, CONTRIBUTING.md), the spreads over the repetitions of the overlapped step
    and of the longer piece alone, and whether they overlap (the difference is then not
    distinguishable here). With the models (the all-reduce's seconds, {label: compute's seconds}):
    their comm and compute, the sequential step's M + C, and the overlapped step's with
    contention c, max(M, C + M c/(1 + c)) (the compute runs 1 + c times slower while the
    all-reduce runs)."""
    keys = list(runs[0]["stamps"])
    variants = list(dict.fromkeys(v for _, _, v in keys))
    rows = []
    for r, c in sorted({(r, c) for r, c, _ in keys}):
        med = {v: statistics.median(slowest(runs, (r, c, v))) * 1e3 for v in variants}
        over = [t * 1e3 for t in slowest(runs, (r, c, "overlapped"))]
        s, spread = timing.summary(over), timing.spread_label(len(over))
        longer = max(("comm alone", "compute alone"), key=med.get)
        ideal, p = med[longer], timing.summary([t * 1e3 for t in slowest(runs, (r, c, longer))])
        row = {label: r, "contention": c, "measured ratio": med["compute alone"] / med["comm alone"],
               **{v.replace(" alone", "") + " ms": m for v, m in med.items()},
               "ideal ms": ideal, "overlapped - ideal": med["overlapped"] - ideal,
               "overlap": (med["comm alone"] + med["compute alone"] - med["overlapped"])
               / med["comm alone"],
               f"overlapped {spread}": f"{s['p10']:.1f}-{s['p90']:.1f}",
               f"ideal {spread}": f"{p['p10']:.1f}-{p['p90']:.1f}",
               "spreads overlap": s["p10"] <= p["p90"] and p["p10"] <= s["p90"]}
        if comm_model_s is not None:
            m, k = comm_model_s * 1e3, compute_model_s[r] * 1e3
            row.update({"comm model ms": m, "compute model ms": k, "sequential model ms": m + k,
                        "overlapped model ms": max(m, k + m * c / (1 + c))})
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
