"""Drawing the ring of lecture 02: the chunked broadcast's pipeline and the ring all-reduce's state,
and its measurements set beside their models as table rows.

What these figures show is taught in the lecture (the ring and its simulation live there); this
module only draws, in the notebook process:

    ring_figures.pipeline(k=4, chunk_counts=(1, 4, 16))   # chunk c crosses link j during step c + j
    ring_figures.show_state(state)                         # one step of the simulated ring, one figure
    ring_figures.all_states(states, title="simulated")      # every step at once (the static page)
    report.table(*ring_figures.beside_model(rows, model, lambda r: {"S": r["collective"]}))

A state is what the lecture's simulation yields: (phase, step, sends [(src, dst, chunk)],
holds[rank][chunk] = the set of ranks whose contributions that rank holds for that chunk).
"""
import math

import matplotlib.pyplot as plt

from helpers import plots, timing


def draw_pipeline(ax, k, s):
    """Chunk c crosses link j (rank j -> j+1) during step c + j; a step lasts N/(S B)."""
    for c in range(s):
        for j in range(k - 1):
            ax.add_patch(plt.Rectangle(((c + j) / s, j - 0.4), 1 / s, 0.8, facecolor=plots.COLORS[c % 8],
                                       edgecolor="white", alpha=0.8))
            if s <= 8:
                ax.text((c + j + 0.5) / s, j, str(c), ha="center", va="center", fontsize=8)
    total = (k - 2 + s) / s
    ax.axvline(total, color=plots.REFERENCE, ls="--")
    ax.set_xlim(0, k - 1 + 0.1)
    ax.set_ylim(k - 1.5, -0.5)
    ax.set_yticks(range(k - 1), [f"{j}->{j + 1}" for j in range(k - 1)])
    ax.set_xlabel("time (units of N/B)")
    ax.set_title(f"S = {s}: T = {total:.2f} N/B")
    ax.grid(False)


def pipeline(k=4, chunk_counts=(1, 4, 16)):
    """One panel per chunk count: the chunked ring broadcast's pipeline filling on k ranks."""
    fig, axes = plots.figure(ncols=len(chunk_counts), width=4.3 * len(chunk_counts), height=3)
    for ax, s in zip(axes, chunk_counts):
        draw_pipeline(ax, k, s)
    axes[0].set_ylabel("link of the ring")
    fig.suptitle(f"Chunked broadcast on a ring of {k} ranks (α = 0): the pipeline fills, "
                 "then every link is busy")
    plt.tight_layout()
    plt.show()


def draw_state(ax, state):
    """Rows ranks, columns chunks; a cell lists whose contributions the rank holds for the chunk
    (a sum sign: everyone's); arrows are the step's messages, a framed cell what was just received."""
    phase, step, sends, holds = state
    k = len(holds)
    cmap = plt.get_cmap("Greens")
    received = {(dst, c) for _, dst, c in sends}
    for r in range(k):
        for c in range(k):
            h = holds[r][c]
            ax.add_patch(plt.Rectangle((c - 0.45, r - 0.4), 0.9, 0.8, facecolor=cmap(0.15 + 0.7 * len(h) / k),
                                       edgecolor="black" if (r, c) in received else "none", lw=1.5))
            label = "Σ" if len(h) == k else "+".join(str(i) for i in sorted(h))
            ax.text(c, r, label, ha="center", va="center", fontsize=9 if k <= 4 else 7)
    for src, dst, c in sends:
        wrap = dst < src                                  # the arrow from the last rank back to 0
        lift = -0.3 if wrap else 0.3
        ax.annotate("", xy=(c + 0.38, dst - lift), xytext=(c + 0.38, src + lift),
                    arrowprops=dict(arrowstyle="->", color="tab:red", lw=1.2,
                                    connectionstyle="arc3,rad=-0.5" if wrap else "arc3"))
    ax.set_xlim(-0.6, k - 0.3)
    ax.set_ylim(k - 0.4, -0.6)
    ax.set_xticks(range(k), [f"chunk {c}" for c in range(k)], fontsize=8)
    ax.set_yticks(range(k), [f"rank {r}" for r in range(k)], fontsize=8)
    ax.grid(False)
    ax.set_title("start: rank r holds its own data" if phase == "start" else f"{phase}, step {step}",
                 fontsize=9)


def show_state(state):
    """One state of the ring, as its own figure (what the lecture's slider shows)."""
    k = len(state[3])
    fig, ax = plt.subplots(figsize=(1.3 * k + 1, 1.1 * k + 0.6))
    draw_state(ax, state)
    plt.show()


def all_states(states, cols=4, title=None):
    """Every state at once, in reading order (what the rendered page shows under the slider);
    title: what drew them (the simulation, or a recording of the code)."""
    k = len(states[0][3])
    cols = min(cols, len(states))
    rows = math.ceil(len(states) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.3 * cols, (0.8 * k + 0.8) * rows), squeeze=False)
    for ax, state in zip(axes.flat, states):
        draw_state(ax, state)
    for ax in list(axes.flat)[len(states):]:
        ax.axis("off")
    fig.suptitle(f"Ring all-reduce on {k} ranks: {k - 1} reduce-scatter steps, then {k - 1} all-gather steps"
                 + (f" ({title})" if title else ""), y=1.0)
    plt.tight_layout()
    plt.show()


def errorbars(ax, xs, rows, **kw):
    """bench.sweep rows as medians (ms) with their p10-p90 as error bars, at xs."""
    ax.errorbar(xs, [r["time_us"] / 1e3 for r in rows],
                yerr=[[(r["time_us"] - r["p10_us"]) / 1e3 for r in rows],
                      [(r["p90_us"] - r["time_us"]) / 1e3 for r in rows]], capsize=3, **kw)


def beside_model(rows, model, label, what="measured"):
    """bench.sweep rows beside a model, as (table rows, columns) for report.table: label(row)'s
    columns, the rows' median and its spread (ms), the model's time (ms), their ratio, and
    whether the model lies inside the spread (then the two are not distinguishable here). what:
    how the rows' times were had ("on the model" for a scaled model's, machines.Scaled.rows)."""
    spread = timing.spread_label(len(rows[0]["times_us"]))
    out = []
    for r in rows:
        t = model(r)
        out.append({**label(r), f"{what} (ms)": r["time_us"] / 1e3,
                    f"{spread} (ms)": f"{r['p10_us'] / 1e3:.3g}-{r['p90_us'] / 1e3:.3g}",
                    "formula (ms)": t * 1e3, f"{what} / formula": r["time_us"] * 1e-6 / t,
                    "formula in spread": r["p10_us"] <= t * 1e6 <= r["p90_us"]})
    return out, list(out[0])
