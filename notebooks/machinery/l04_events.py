"""Lecture 04's machinery for sections 1 and 2, which the lecture uses and does not teach: the
schematic of section 1 and the instruments that time section 2's two-stream code on a GPU (CUDA
events recorded around each copy and matmul by a dispatch mode, so the lecture's functions stay
plain), its table and figure (measured here or kept in data/). Every time here is a CUDA event on
the streams, except the host's return from the copy call (perf_counter).
"""
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import plots, report, timing

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


def concurrency(r):
    """Within one repetition (gpu_case's dict): the time the copy and the matmul ran at once,
    from their events, over the shorter of the two; None when one of them is missing."""
    if "copy" not in r or "matmul" not in r:
        return None
    (cs, ce), (ms, me) = r["copy"], r["matmul"]
    return max(0.0, min(ce, me) - max(cs, ms)) / min(ce - cs, me - ms)


def gpu_run(cases, n, copy_numel, repeats):
    """cases: {name: fn(dst, host, a, b) -> the product or None}. Each case runs from pageable and
    from pinned memory, warm-up then `repeats` times; the median repetition by total is kept, with
    the spread over the repetitions ("spread": {"total"/"concurrency": [p10, p90]}, nearest rank).
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
            if concurrency(runs[0]) is not None:
                spread["concurrency"] = [concurrency(r) for r in runs]
            kept["spread"] = {k: [timing.summary(v)["p10"], timing.summary(v)["p90"]]
                              for k, v in spread.items()}
            results[f"{memory} / {name}"] = kept
    return results


def stream_rows(res):
    """Per memory kind and launch order: the times (ms) of the median repetitions, the ideal
    max(copy, matmul), and the concurrency read from the two-stream run's events."""
    rows = []
    for memory in ("pageable", "pinned"):
        r = lambda how: res[f"{memory} / {how}"]  # noqa: E731
        copy_ms, mm_ms = r("copy alone")["total"], r("matmul alone")["total"]
        for how, first in (("two streams", "copy"), ("two streams, matmul first", "matmul")):
            two = r(how)
            row = {"memory": memory, "first": first, "copy ms": copy_ms, "matmul ms": mm_ms,
                   "sequential ms": r("sequential")["total"], "two streams ms": two["total"],
                   "ideal ms": max(copy_ms, mm_ms), "concurrency": concurrency(two),
                   "copy call returns ms": two["host_copy_call"],
                   "copy ends ms": two["copy"][1], "matmul starts ms": two["matmul"][0]}
            for key, (p10, p90) in two.get("spread", {}).items():
                key = "concurrency" if key == "overlap" else key     # its name in older runs
                row[f"{key} p10-p90"] = f"{p10:.2f}-{p90:.2f}"
            rows.append(row)
    return rows


def show_stream_run(res, title):
    """The table and the timeline of one gpu_run (measured here, or kept in data/)."""
    import matplotlib.pyplot as plt

    rows = stream_rows(res)
    print(title)
    first = ["memory", "first", "copy ms", "matmul ms", "sequential ms", "two streams ms",
             "ideal ms", "concurrency"]
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
