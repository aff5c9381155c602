"""Lecture 03's machinery, which the lecture uses and does not teach: numbers printed with the
precision they have (sig, span), the arithmetic that turns the course reading's timings into its
steps (section 6), and the figures of the sweep (section 4), of one call per barrier against the
loop (section 5) and of one GPU's kept run (section 8).

The reading (CS336 lecture_08.py) prints, for all-reduce, 2(K-1) S / (K t) and, for reduce-scatter,
(K-1) x (its output's bytes) / (K t), in units of 1024**3 bytes. reading_steps() removes one flaw
at a time, from the clocks the lecture's `reading_way` read around the same calls. chain_ends()
simulates section 5's chain broadcast, whole messages or chunks, for the exercises' checks.
"""
import numpy as np

# (step, the clock it reads, its unit of a GB, reduce-scatter's S = its input)
STEPS = [("as in the reading", "reading", 1024**3, False),
         ("+ GB = 1e9 bytes", "reading", 1e9, False),
         ("+ barrier out of the timed window", "no barrier", 1e9, False),
         ("+ a loop of n calls", "loop", 1e9, False),
         ("+ reduce-scatter's S = its input", "loop", 1e9, True)]


def sig(x, digits=2):
    """x to `digits` significant figures, written plainly: 1158.3 -> '1200', 0.8787 -> '0.88'."""
    return f"{float(f'{x:.{digits}g}'):g}"


def span(values, digits=2):
    """'lo-hi' of values (timing.summary's p10-p90, which is the min-max up to 5 values)."""
    from helpers.timing import summary

    s = summary(values)
    return f"{sig(s['p10'], digits)}-{sig(s['p90'], digits)}"


def reading_figure(collective, k, n_elements, seconds, unit, rs_input=False, item=4):
    """The reading's bandwidth for one timing: n_elements float32 per rank (its all-reduce's
    tensor; its reduce-scatter's output, the input being K times that)."""
    if collective == "all_reduce":
        return item * n_elements * 2 * (k - 1) / (k * seconds) / unit
    counted = item * n_elements * (k if rs_input else 1)       # the input's bytes, or the output's
    return counted * (k - 1) / (k * seconds) / unit


def _cell(values):
    """'median (lo-hi)' of several values, three significant figures."""
    from helpers.timing import summary

    s = summary(values)
    return f"{s['median']:.3g} ({s['p10']:.3g}-{s['p90']:.3g})"


def reading_steps(timings, k, n_elements, harness):
    """timings: {collective: [{clock: seconds} per repetition]}; harness: {collective: the
    harness's row at the same size}. Returns (rows for report.table: the steps in GB/s, then the
    harness's busbw, each 'median (spread)' with the spread's kind in the column's name),
    {(i, collective): figures}), i the number of flaws removed (0: as in the reading)."""
    from helpers.cost import busbw
    from helpers.timing import spread_label

    figures, rows = {}, []
    n = {len(reps) for reps in timings.values()} | {len(r["times_us"]) for r in harness.values()}
    if len(n) != 1:
        raise ValueError("the reading's repetitions and the harness's rounds must be as many")
    label = spread_label(n.pop())
    head = lambda c: f"{c}, GB/s: median ({label})"  # noqa: E731
    for i, (step, clock, unit, rs_input) in enumerate(STEPS):
        row = {"step": step}
        for c, reps in timings.items():
            figures[i, c] = [reading_figure(c, k, n_elements, r[clock], unit, rs_input)
                             for r in reps]
            row[head(c)] = _cell(figures[i, c])
        rows.append(row)
    rows.append({"step": "the harness's busbw (nccl-tests' method)",
                 **{head(c): _cell([busbw(r["kind"], r["size"], t / 1e6, k)
                                    for t in r["times_us"]])
                    for c, r in harness.items()}})
    return rows, figures


def _bars(rows, value):
    """value(row, time_us) at the rows' medians, and its error bars (below, above) from their
    p10 and p90 times (a value may fall as the time grows: busbw)."""
    mid = np.array([value(r, r["time_us"]) for r in rows])
    ends = np.array([[value(r, r["p10_us"]), value(r, r["p90_us"])] for r in rows])
    return mid, np.stack([mid - ends.min(axis=1), ends.max(axis=1) - mid])


def sweep_figure(groups, fits):
    """busbw against size per collective (one panel each): the median of the rounds (dots), their
    spread (bars: p10-p90, or min-max up to 5 rounds), and the fitted t = alpha + n/B (line)."""
    import matplotlib.pyplot as plt

    from helpers import cost, plots
    from helpers.timing import spread_label

    names = list(dict.fromkeys(c for c, _ in groups))
    ks = sorted({k for _, k in groups})
    fig, axes = plt.subplots(2, (len(names) + 2) // 2, figsize=(13, 7))
    rounds = len(next(iter(groups.values()))[0]["times_us"])
    for ax, name in zip(axes.flat, names):
        for i, k in enumerate(ks):
            g, f, color = groups[name, k], fits[name, k], plots.COLORS[i]
            n = [r["size"] for r in g]
            mid, err = _bars(g, lambda r, t: cost.busbw(r["kind"], r["size"], t / 1e6, k))
            ax.errorbar(n, mid, yerr=err, fmt="o", ms=3, capsize=2, color=color,
                        label=f"K={k}: median, bars {spread_label(rounds)} of {rounds} rounds")
            fine = np.geomspace(n[0], n[-1], 100)
            ax.plot(fine, cost.fit_busbw_curve(f, fine, g[0]["kind"], k), "-", lw=1,
                    color=color, label=f"K={k}: t = α + n/B, the rounds' median fit")
        ax.set_ylim(bottom=0)
        plots.log2_size_axis(ax, n[::max(1, len(n) // 5)])
        ax.set_title(name)
        ax.set_ylabel("busbw (GB/s)")
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    axes.flat[-1].legend(handles, labels, loc="center")
    fig.suptitle("busbw against size, nccl-tests' method; own scale per panel")
    fig.tight_layout()
    return fig


def per_call_figure(loop_rows, per_call_rows):
    """Time against size: every call of the per-call method (slowest rank, dots), their median,
    and the loop's time per call (median of the rounds, bars: their spread)."""
    import matplotlib.pyplot as plt

    from helpers import plots
    from helpers.timing import spread_label

    fig, ax = plt.subplots(figsize=(10, 4))
    calls, rounds = len(per_call_rows[0]["times_us"]), len(loop_rows[0]["times_us"])
    for j, r in enumerate(per_call_rows):
        ax.plot([r["size"] * 1.06] * calls, r["times_us"], ".", ms=3, alpha=0.35,
                color=plots.COLORS[1], label=f"per call: each of {calls} calls" if j == 0 else None)
    ax.plot([r["size"] * 1.06 for r in per_call_rows], [r["time_us"] for r in per_call_rows],
            "_", ms=14, mew=2, color=plots.COLORS[1], label="per call: median")
    mid, err = _bars(loop_rows, lambda r, t: t)
    ax.errorbar([r["size"] / 1.06 for r in loop_rows], mid, yerr=err, fmt="o", ms=4, capsize=2,
                color=plots.COLORS[0],
                label=f"loop: median of {rounds} rounds, bars {spread_label(rounds)}")
    ax.set_yscale("log")
    plots.log2_size_axis(ax, [r["size"] for r in loop_rows])
    ax.set_ylabel("time per call (us)")
    k = loop_rows[0]["world_size"]
    ax.set_title(f"all_reduce, K={k}: one call per barrier against the loop")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def floor_rows(rows, upto=2**24):
    """One GPU's rows (K=1) in a table: per collective and method, the median over the sizes up
    to `upto` and the time at the largest size, in microseconds."""
    from statistics import median

    from helpers import plots

    largest = max(r["size"] for r in rows)
    out = []
    for c in dict.fromkeys(r["collective"] for r in rows):
        row = {"collective": c}
        for m, name in (("nccl-tests", "loop"), ("per-call", "per call")):
            mine = [r for r in rows if r["collective"] == c and r["method"] == m]
            row[f"{name}, <= {plots.bytes_label(upto)}"] = median(
                r["time_us"] for r in mine if r["size"] <= upto)
            row[f"{name}, {plots.bytes_label(largest)}"] = next(
                r["time_us"] for r in mine if r["size"] == largest)
        out.append(row)
    return out


def floor_figure(runs):
    """Time per call against size on one GPU (K=1), for the all-reduce (in place) and the
    all-gather (out of place): the loop (dots) and one call per barrier (squares, bars: the
    spread of its calls), for each (label, rows) of `runs`."""
    import matplotlib.pyplot as plt

    from helpers import plots
    from helpers.timing import spread_label

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, name in zip(axes, ("all_reduce", "all_gather")):
        for j, (label, rows) in enumerate(runs):
            for method, style in (("nccl-tests", "o-"), ("per-call", "s:")):
                sel = [r for r in rows if r["world_size"] == 1 and r["collective"] == name
                       and r["method"] == method]
                mid, err = _bars(sel, lambda r, t: t)
                n = len(sel[0]["times_us"])
                kind = "loop" if method == "nccl-tests" else "per call"
                spread = f", bars {spread_label(n)} of {n}" if n > 1 else ", one round"
                ax.errorbar([r["size"] for r in sel], mid, yerr=err, fmt=style, ms=4, capsize=2,
                            color=plots.COLORS[2 * j + (method == "per-call")],
                            label=f"{kind}{spread}; {label}")
        plots.log2_size_axis(ax, [r["size"] for r in sel])
        ax.set_yscale("log")
        ax.set_title(f"{name}, K=1 ({'in place' if name == 'all_reduce' else 'out of place'})")
    axes[0].set_ylabel("time per call (us)")
    handles, labels = axes[0].get_legend_handles_labels()     # below both: the labels are long
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(2, len(labels)))
    fig.suptitle("NCCL on one GPU: no byte crosses a link")
    fig.tight_layout(rect=(0, 0.06 * ((len(labels) + 1) // 2), 1, 1))
    return fig


def chain_ends(k, n, s=1):
    """Each rank's end of a loop of n chain broadcasts on k ranks (root 0 -> 1 -> ... -> k-1),
    in hops of a whole message, each message cut into s chunks of 1/s hop: chunk m reaches rank
    j+1 once rank j has it and has sent chunk m-1 (one out-port per rank). Returns [the root's
    end (its last send), rank j's for 0 < j < k-1 (its last forward), the last rank's]."""
    at = [[(m + 1) / s for m in range(n * s)]]            # arrivals at rank 1: the root's sends
    for _ in range(k - 2):
        row = []
        for t in at[-1]:
            row.append(max(t, row[-1] if row else 0.0) + 1 / s)
        at.append(row)
    return [at[0][-1]] + [a[-1] for a in at[1:]] + [at[-1][-1]]
