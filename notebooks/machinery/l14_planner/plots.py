"""The figures of lecture 14 (the planner): a plan's memory and time per layout, broken down
(plan_bars), and the planner's step against the step emulated on the H100 model (check_bars). Drawing only:
the numbers come from machinery.l14_planner."""
import matplotlib.pyplot as plt

from helpers import plots

TIME_TERMS = ("compute", "tensor", "context", "expert", "p2p", "bubble", "data")
MEMORY_TERMS = ("params", "grads", "optim", "activations", "working", "logits")
CHECK_TERMS = ("compute", "tensor", "p2p", "bubble", "data")       # section 4's terms


def label(r):
    """A configuration in two lines: its layout, then ZeRO, micro-batch and recomputation."""
    return f"t{r['tp']} p{r['pp']} d{r['dp']}\nZ{r['zero']} b{r['micro_batch']} {r['recompute'][:3]}"


def plan_bars(shown, memory, usable, title):
    """Memory (GB per GPU of the fullest stage, with the GPU's memory and the usable part as lines)
    and step time (s) of the configurations `shown`, each stacked by term."""
    fig, (ax_m, ax_t) = plots.figure(ncols=2, width=12, height=4.2)
    x = range(len(shown))
    for ax, terms, key, scale in ((ax_m, MEMORY_TERMS, "memory", 1e-9), (ax_t, TIME_TERMS, "time", 1.0)):
        bottom = [0.0] * len(shown)
        for i, term in enumerate(terms):
            values = [r[key].get(term, 0.0) * scale for r in shown]
            if not any(values):                  # a term no shown configuration pays
                continue
            ax.bar(x, values, bottom=bottom, color=plots.COLORS[i], label=term)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_xticks(list(x), [label(r) for r in shown], fontsize=7)
        ax.legend(fontsize=7)
    ax_m.axhline(memory * 1e-9, color=plots.REFERENCE, ls="--", lw=1)
    ax_m.axhline(usable * 1e-9, color=plots.REFERENCE, ls=":", lw=1)        # less the reserve
    ax_m.set_ylabel("GB per GPU (fullest stage)")
    ax_m.set_title("memory, best configuration of each layout")
    ax_t.set_ylabel("seconds per step")
    ax_t.set_title(title)
    plt.show()


def check_bars(rows, title):
    """Per layout: the planner's step stacked by term (left) and the emulated step (right)."""
    fig, ax = plots.figure(width=11, height=3.8)
    for j, r in enumerate(rows):
        bottom = 0.0
        for i, term in enumerate(CHECK_TERMS):
            ax.bar(j - 0.2, r[term], 0.4, bottom=bottom, color=plots.COLORS[i],
                   label=None if j else term)
            bottom += r[term]
        ax.bar(j + 0.2, r["emulated ms"], 0.4, color="white", edgecolor=plots.MEASURED, hatch="//",
               label=None if j else "emulated")
    labels = [r["d,t,p,m"].rsplit(",", 1) for r in rows]        # "2,1,4,8 1+2x3+1": stages below
    ax.set_xticks(range(len(rows)), [f"{dtp}\nm={m}".replace(" ", "\n") for dtp, m in labels],
                  fontsize=7)
    ax.set_ylim(0, 1.08 * max(max(r["emulated ms"], sum(r[t] for t in CHECK_TERMS)) for r in rows))
    ax.set_ylabel("ms per step (the model's)")
    ax.set_xlabel("d,t,p and micro-batches m")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    plt.show()
