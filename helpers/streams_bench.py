"""Lecture 04's machinery, which the lecture uses and does not teach: the schematic of section 1,
the instruments that time section 2's two-stream code on a GPU (CUDA events recorded around each
copy and matmul by a dispatch mode, so the lecture's functions stay plain), its table and figure
(measured here or kept in data/), and the CPU path of section 4: a paced all-reduce (a link that
costs time but no core), the ranks' timed repetitions, and the CPU time a collective takes.

Every time on the CPU path is the host clock (perf_counter, helpers.timing's CPU clock) read
around the lecture's step functions after a barrier; on a GPU, CUDA events on the streams.
"""
import contextlib
import functools
import statistics
import time

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import cost, plots, report, standins, timing

# ---------------------------------------------------------------------------- section 1


def schematic():
    """A drawing (no measurement): one host thread launching work on two streams."""
    import matplotlib.pyplot as plt

    fig, ax = plots.figure(height=2.4)
    rows = {"host thread": 2, "stream 1 (compute)": 1, "stream 2 (copy)": 0}
    bars = [("host thread", 0.0, 0.3, "copy"), ("host thread", 0.35, 0.3, "matmul"),
            ("host thread", 0.7, 2.3, "free: other work, then synchronize()"),
            ("stream 2 (copy)", 0.3, 1.8, "H2D copy (copy engine)"),
            ("stream 1 (compute)", 0.65, 2.3, "matmul (SMs)")]
    for row, start, length, label in bars:
        color = plots.REFERENCE if row == "host thread" else plots.COLORS[rows[row] % 2]
        ax.barh(rows[row], length, left=start, color=color, alpha=0.8)
        ax.text(start + 0.03, rows[row], label, va="center", fontsize=8)
    ax.set_yticks(list(rows.values()), list(rows.keys()))
    ax.set_xlabel("time (schematic); the host's first two bars: launches")
    ax.set_xticks([])
    ax.set_title("Launches return at once; two streams run side by side")
    plt.show()


# ---------------------------------------------------------------------------- section 2 (GPU)

class _PieceEvents(TorchDispatchMode):
    """Records a CUDA event on the current stream before and after every copy_ and mm (the
    stream they are queued on), and the host time the copy call took to return."""

    NAMES = {"aten.copy_.default": "copy", "aten.mm.default": "matmul"}

    def __init__(self):
        super().__init__()
        self.events, self.host_copy_call = {}, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = self.NAMES.get(str(func))
        if name is None:
            return func(*args, **(kwargs or {}))
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        t0 = time.perf_counter()
        start.record()
        out = func(*args, **(kwargs or {}))
        end.record()
        if name == "copy":
            self.host_copy_call = (time.perf_counter() - t0) * 1e3
        self.events[name] = (start, end)
        return out


def gpu_case(fn, *args):
    """One run of fn(*args) on a quiet GPU: {"total": ms, "copy"/"matmul": (start, end) ms,
    "host_copy_call": ms}, every time from CUDA events relative to a start event, and fn's value."""
    torch.cuda.synchronize()
    begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    mode = _PieceEvents()
    begin.record()
    with mode:
        value = fn(*args)
    finish.record()
    finish.synchronize()
    out = {"total": begin.elapsed_time(finish)}
    for name, (s, e) in mode.events.items():
        out[name] = (begin.elapsed_time(s), begin.elapsed_time(e))
    if mode.host_copy_call is not None:
        out["host_copy_call"] = mode.host_copy_call
    return out, value


def span_overlap(r):
    """Within one repetition (gpu_case's dict): the time the copy and the matmul ran at once,
    from their events, over the shorter of the two; None when one of them is missing."""
    if "copy" not in r or "matmul" not in r:
        return None
    (cs, ce), (ms, me) = r["copy"], r["matmul"]
    return max(0.0, min(ce, me) - max(cs, ms)) / min(ce - cs, me - ms)


def gpu_run(cases, n, copy_numel, repeats):
    """cases: {name: fn(dst, host, a, b) -> the product or None}. Each case runs from pageable and
    from pinned memory, warm-up then `repeats` times; the median repetition by total is kept, with
    the spread over the repetitions ("spread": {"total"/"overlap": [p10, p90]}, nearest rank).
    Every copy and product is checked. Returns {"memory / case": gpu_case's dict}."""
    dev = torch.device("cuda")
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    dst = torch.empty(copy_numel, device=dev)
    hosts = {"pageable": torch.randn(copy_numel), "pinned": torch.randn(copy_numel).pin_memory()}
    reference = a @ b
    results = {}
    for memory, host in hosts.items():
        expected = host.to(dev)
        for name, fn in cases.items():
            runs = []
            for i in range(repeats + 1):                  # the first is the warm-up
                dst.fill_(float("nan"))                   # a copy that did not happen shows
                out, product = gpu_case(fn, dst, host, a, b)
                if "copy" in out:
                    assert torch.equal(dst, expected), f"{memory} / {name}: the copy is wrong"
                if product is not None:                   # float32: cuBLAS may pick another kernel
                    torch.testing.assert_close(product, reference, rtol=1e-4, atol=1e-3)
                runs += [out] if i else []
            kept = dict(sorted(runs, key=lambda r: r["total"])[repeats // 2])
            spread = {"total": [r["total"] for r in runs]}
            if span_overlap(runs[0]) is not None:
                spread["overlap"] = [span_overlap(r) for r in runs]
            kept["spread"] = {k: [timing.summary(v)["p10"], timing.summary(v)["p90"]]
                              for k, v in spread.items()}
            results[f"{memory} / {name}"] = kept
    return results


def stream_rows(res):
    """Per memory kind and launch order: the times (ms) of the median repetitions, the ideal
    max(copy, matmul), and the overlap read from the two-stream run's events (span_overlap)."""
    rows = []
    for memory in ("pageable", "pinned"):
        r = lambda how: res[f"{memory} / {how}"]  # noqa: E731
        copy_ms, mm_ms = r("copy alone")["total"], r("matmul alone")["total"]
        for how, first in (("two streams", "copy"), ("two streams, matmul first", "matmul")):
            two = r(how)
            row = {"memory": memory, "first": first, "copy ms": copy_ms, "matmul ms": mm_ms,
                   "sequential ms": r("sequential")["total"], "two streams ms": two["total"],
                   "ideal ms": max(copy_ms, mm_ms), "overlap": span_overlap(two),
                   "copy call returns ms": two["host_copy_call"],
                   "copy ends ms": two["copy"][1], "matmul starts ms": two["matmul"][0]}
            for key, (p10, p90) in two.get("spread", {}).items():
                row[f"{key} p10-p90"] = f"{p10:.2f}-{p90:.2f}"
            rows.append(row)
    return rows


def show_stream_run(res, title):
    """The table and the timeline of one gpu_run (measured here, or kept in data/)."""
    import matplotlib.pyplot as plt

    rows = stream_rows(res)
    print(title)
    first = ["memory", "first", "copy ms", "matmul ms", "sequential ms", "two streams ms",
             "ideal ms", "overlap"]
    report.table(rows, first, floatfmt="{:.2f}")
    report.table(rows, ["memory", "first"] + [c for c in rows[0] if c not in first],
                 floatfmt="{:.2f}")
    shown = ("sequential", "two streams", "two streams, matmul first")
    fig, axes = plots.figure(nrows=2, width=10, height=5.5, sharex=True)
    for ax, memory in zip(axes, ("pageable", "pinned")):
        for row, how in enumerate(shown):
            r = res[f"{memory} / {how}"]
            for k, (name, color) in enumerate((("copy", plots.COLORS[0]),
                                               ("matmul", plots.COLORS[1]))):
                s, e = r[name]
                first = (row, memory) == (0, "pageable")
                ax.barh(2 * row + k * 0.8, e - s, left=s, height=0.7, color=color,
                        label=name if first else None)
            ax.plot([r["total"]] * 2, [2 * row - 0.5, 2 * row + 1.3], color="black", lw=1.5,
                    label="end" if (row, memory) == (0, "pageable") else None)
        ideal = max(res[f"{memory} / copy alone"]["total"], res[f"{memory} / matmul alone"]["total"])
        ax.axvline(ideal, color=plots.MODEL, ls="--",
                   label="ideal max(copy, matmul)" if memory == "pageable" else None)
        ax.set_yticks([0.4, 2.4, 4.4],
                      ["sequential", "two streams,\ncopy first", "two streams,\nmatmul first"])
        ax.set_title(f"{memory} host memory")
    axes[-1].set_xlabel("ms since the start event (CUDA events)")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    plt.show()
    return rows


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
    wait() returns once the real all-reduce is done and that time has passed. The caller is free
    until then, as it would be with a GPU's link. Sleeps on the host: gloo only. `spans`: a list
    that gets ("all-reduce", start, end) per call, host clock."""
    real = dist.all_reduce
    if dist.get_backend() != "gloo":
        raise RuntimeError("the paced all-reduce sleeps on the host: run it on gloo")

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        k = dist.get_world_size(group)
        nbytes = tensor.numel() * tensor.element_size()
        start = time.perf_counter()
        due = start + cost.ring_all_reduce(nbytes, k, gbps * 1e9)
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
