"""Lecture 06's picture of ZeRO: what each rank holds of the parameters, the gradients and the
optimizer state, stage by stage. The same drawing serves the lecture's formula (its
model_state_bytes: the specification) and the bytes a run held (measured), so the two can be
held side by side:

    zero_figures.draw_holdings({"DDP": {"params": 2, "grads": 2, "optim": 12}, ...}, 4, "title",
                               whole={"params": 2, "grads": 2, "optim": 12})   # DDP's by default

A stage maps each term to what one rank holds, in bytes per parameter (or, measured, per rank:
[{term: bytes per parameter}] one dict a rank). Rank r's piece of a sharded term is drawn at
r/n of it: the slice ZeRO gives it. It holds none of the lecture's code.
"""
TERMS = ("params", "grads", "optim")


def draw_holdings(stages, n, title, whole=None):
    """One panel per stage: a row per rank, the three terms side by side (their widths the whole
    model's bytes per parameter, `whole`: by default the first stage's, DDP's, which holds all),
    the part the rank holds filled, the rest outlined."""
    import matplotlib.pyplot as plt

    from helpers import plots

    fig, axes = plots.figure(ncols=len(stages), width=3.3 * len(stages), height=0.9 + 0.4 * n)
    whole = whole or next(iter(stages.values()))
    starts = [sum(whole[t] for t in TERMS[:i]) for i in range(len(TERMS))]
    for ax, (name, held) in zip(axes, stages.items()):
        per_rank = held if isinstance(held, list) else [held] * n
        for r, mine in enumerate(per_rank):
            for t, x0 in zip(TERMS, starts):
                ax.barh(r, whole[t], left=x0, color="none", edgecolor="lightgray")
                size = mine[t]
                at = x0 if size >= whole[t] * (1 - 1e-9) else x0 + r * size   # rank r's slice
                ax.barh(r, size, left=at, color=plots.COLORS[TERMS.index(t)], alpha=0.85)
        total = [sum(m[t] for t in TERMS) for m in per_rank]
        ax.set_yticks(range(n), [f"rank {r}: {b:.3g}" for r, b in enumerate(total)], fontsize=8)
        ax.set(ylim=(n - 0.5, -0.5), xlim=(0, sum(whole.values())), title=name, xticks=[])
        ax.grid(False)
    axes[-1].legend(handles=[plt.Rectangle((0, 0), 1, 1, color=plots.COLORS[i], alpha=0.85,
                                           label=t) for i, t in enumerate(TERMS)],
                    fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    fig.suptitle(f"Bytes per parameter each of N = {n} ranks holds: {title}", fontsize=10)
    plt.tight_layout()
    plt.show()
