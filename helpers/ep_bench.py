"""Lecture 12's measuring machinery (expert parallelism): the model of the bytes its all-to-alls
carry, computed from the routing's counts alone, the key claim's check against what
helpers.trace counted around the layer, and the key figure. It holds none of the lecture's code.

The layer on rank r of K makes five all-to-alls per forward and backward, in this order:

1. the counts: E int64 (8 E bytes), E/K to every rank;
2. the dispatch: the rows of r's kept assignments, `kept[r].sum()` rows of d numbers;
3. the return: the rows r's experts computed, what every rank kept for them,
   `kept[:, r E/K:(r+1) E/K].sum()` rows;
4. backward, the return's mirror: as many rows as the dispatch sent;
5. backward, the dispatch's mirror: as many rows as the return sent.

S is nccl-tests' all-to-all size, the whole input of the call (helpers.trace's `nbytes`); the
share that leaves the rank is S less the rows r keeps for its own experts.
"""
import torch

from helpers import plots

NAMES = ("counts", "dispatch", "return", "return (bwd)", "dispatch (bwd)")


def all_to_all_model(kept, rank, dim, itemsize):
    """The S of each of rank `rank`'s five all-to-alls (see the module's docstring), in bytes.
    kept: K x E, the assignments rank i kept for expert e (the single process's routing)."""
    K, E = kept.shape
    per = E // K
    sent = int(kept[rank].sum()) * dim * itemsize
    got = int(kept[:, rank * per:(rank + 1) * per].sum()) * dim * itemsize
    return [8 * E, sent, got, sent, got]


def counted(calls):
    """S of every all-to-all the tracer saw, in call order."""
    return [c.nbytes for c in calls if c.kind == "all_to_all"]


def assert_all_to_all(calls, model):
    """The key claim: the tracer counted exactly the model's all-to-alls and bytes (both count)."""
    got = counted(calls)
    assert got == model, f"counted all-to-all bytes {got}, the model says {model}"


def leaving(kept, rank, dim, itemsize):
    """Bytes of the dispatch that leave rank `rank`: its kept rows for other ranks' experts."""
    K, E = kept.shape
    per = E // K
    mine = int(kept[rank, rank * per:(rank + 1) * per].sum())
    return (int(kept[rank].sum()) - mine) * dim * itemsize


def draw_bytes(ax, runs, balanced):
    """Bars: S of the dispatch and the return per rank, counted, for each run; markers: the model.
    runs: {label: (counted per rank, model per rank)}, each a list of five-entry lists."""
    K = len(next(iter(runs.values()))[0])
    width = 0.8 / (2 * len(runs))
    for i, (label, (got, model)) in enumerate(runs.items()):
        for j, call in enumerate((1, 2)):
            xs = [r + (2 * i + j + 0.5) * width - 0.4 for r in range(K)]
            ax.bar(xs, [g[call] / 1024 for g in got], width, color=plots.COLORS[2 * i + j],
                   label=f"{label}: {NAMES[call]}, counted")
            ax.plot(xs, [m[call] / 1024 for m in model], "k_", ms=12, mew=2)
    ax.plot([], [], "k_", ms=12, mew=2, label="model from the routing counts")
    ax.axhline(balanced / 1024, color=plots.REFERENCE, ls=":",
               label="balanced router, nothing dropped: n k d x 8")
    top = max(max(g[c], m[c]) for got, model in runs.values() for g, m in zip(got, model)
              for c in (1, 2))
    ax.set(xticks=range(K), xlabel="rank", ylabel="KiB per all-to-all (S)",
           ylim=(0, 1.5 * max(top, balanced) / 1024))
    ax.legend(fontsize=7, loc="upper center", ncol=2)
