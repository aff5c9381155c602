"""Lecture 12's measuring machinery (expert parallelism): the model of the bytes its all-to-alls
carry, computed from the routing's counts alone, and its check against what helpers.trace
counted around the layer; the split matrix (the key claim) and the key figure. It holds none
of the lecture's code.

The layer on rank r of K makes five all-to-alls per forward and backward, in this order:

1. the counts: E int64 (8 E bytes), E/K to every rank;
2. the dispatch: the rows of r's kept assignments, `kept[r].sum()` rows of d numbers;
3. the return: the rows r's experts computed, what every rank kept for them,
   `kept[:, r E/K:(r+1) E/K].sum()` rows;
4. backward, the return's mirror: as many rows as the dispatch sent;
5. backward, the dispatch's mirror: as many rows as the return sent.

S is nccl-tests' all-to-all size, the whole input of the call (helpers.trace's `nbytes`); the
share that leaves the rank is S less the rows r keeps for its own experts.

The key claim counts where the rows go: `splits()` wraps a rank's code and records the split lists
of every `all_to_all_single` (c10d's alltoall_base_, which helpers.trace counts only in bytes);
the dispatch's input splits on rank i are row i of the K x K split matrix, its output splits
column i. `split_model` computes that matrix from the single process's routing.
"""
import contextlib

from torch.utils._python_dispatch import TorchDispatchMode

from helpers import plots, trace


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
    """The bytes check: the tracer counted exactly the model's all-to-alls and bytes."""
    got = counted(calls)
    assert got == model, f"counted all-to-all bytes {got}, the model says {model}"


class _Splits(TorchDispatchMode):
    """Records (input splits, output splits) of every all-to-all made inside (the ops helpers.trace
    names "all_to_all"): the single-tensor form's split-size lists ([] for an even split), the
    list form's rows per tensor."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = f"{func.namespace}.{func._overloadpacket._qualified_op_name.split('::')[1]}"
        if trace.KINDS.get(op) == "all_to_all":
            named = {**dict(zip([a.name for a in func._schema.arguments], args)), **kwargs}
            self.calls.append(tuple(list(named[f"{side}_split_sizes"]) if f"{side}_split_sizes" in named
                                    else [t.numel() for t in named[f"{side}_tensors"]]
                                    for side in ("input", "output")))
        return func(*args, **kwargs)


@contextlib.contextmanager
def splits():
    """Inside a rank: `with splits() as log:` fills log with each all-to-all's split lists."""
    mode = _Splits()
    with mode:
        yield mode.calls


def split_model(kept):
    """The K x K split matrix: rows rank i keeps for rank j's experts (kept: K x E)."""
    K, E = kept.shape
    return kept.view(K, K, E // K).sum(-1).tolist()


def assert_split_matrix(logs, model):
    """The key claim: on every rank i the dispatch (second all-to-all) sent row i of the model
    and received column i, exactly. logs: each rank's `splits()` record."""
    sent = [log[1][0] for log in logs]
    got = [log[1][1] for log in logs]
    cols = [list(c) for c in zip(*model)]
    assert sent == model and got == cols, \
        f"split matrix sent {sent}, received (by column) {got}; the routing says {model}"
    return sent


def leaving(kept, rank, dim, itemsize):
    """Bytes of the dispatch that leave rank `rank`: its kept rows for other ranks' experts."""
    K, E = kept.shape
    per = E // K
    mine = int(kept[rank, rank * per:(rank + 1) * per].sum())
    return (int(kept[rank].sum()) - mine) * dim * itemsize


def draw_splits(ax, matrix):
    """Heatmap of the K x K split matrix (rows rank i sent to rank j), each cell labelled."""
    K = len(matrix)
    ax.imshow(matrix, cmap="Blues", vmin=0, vmax=1.3 * max(map(max, matrix)))
    for i in range(K):
        for j in range(K):
            ax.text(j, i, matrix[i][j], ha="center", va="center", fontsize=9)
    ax.grid(False)
    ax.set(xticks=range(K), yticks=range(K), xlabel="to rank j (its experts)",
           ylabel="from rank i (its tokens)")


def draw_load(ax, routed, kept, cap):
    """Per group and expert: kept assignments, dropped ones stacked above, the capacity line."""
    K, E = routed.shape
    xs = [g * (E + 1) + e for g in range(K) for e in range(E)]
    k, r = kept.reshape(-1).tolist(), routed.reshape(-1).tolist()
    ax.bar(xs, k, color=plots.COLORS[0], label="kept")
    ax.bar(xs, [a - b for a, b in zip(r, k)], bottom=k, color=plots.COLORS[3],
           label="dropped")
    ax.axhline(cap, color=plots.REFERENCE, ls=":", label=f"C = {cap}")
    ax.set(xticks=[g * (E + 1) + (E - 1) / 2 for g in range(K)],
           xticklabels=[f"rank {g}" for g in range(K)], xlabel="each rank's tokens, per expert",
           ylabel="assignments per expert", ylim=(0, 1.3 * max(r + [cap])))
    ax.legend(fontsize=7, loc="upper center", ncol=3)


def draw_dispatch(kept, title):
    """Where the rows go, from the routing (kept: K x E, the assignments each rank's tokens keep
    per expert): a bar per rank of its kept rows, a segment per expert as long as its rows, in
    the colour of the rank that holds the expert (hatched: that rank's second, third, ...
    expert). The dispatch sends each segment to its colour's rank; the return brings it back."""
    import matplotlib.pyplot as plt

    K, E = kept.shape
    per = E // K
    fig, ax = plots.figure(width=9, height=0.7 + 0.5 * K)
    for i in range(K):
        left = 0
        for e in range(E):
            rows = int(kept[i, e])
            if rows:
                ax.barh(i, rows, left=left, color=plots.COLORS[e // per], alpha=0.8,
                        edgecolor="white", hatch="//" if e % per else None)
                ax.text(left + rows / 2, i, f"e{e}", ha="center", va="center", fontsize=7)
            left += rows
    ax.set_yticks(range(K), [f"rank {i}" for i in range(K)])
    ax.set(ylim=(K - 0.5, -0.5), xlabel="rows a rank keeps (its tokens x picks, less those dropped)", title=title)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=plots.COLORS[j], alpha=0.8,
                                     label=f"to rank {j}") for j in range(K)],
              fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    ax.grid(False)
    plt.show()
