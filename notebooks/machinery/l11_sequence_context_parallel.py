"""Lecture 11's measuring machinery. Sequence parallelism's memory: the bytes autograd keeps for the
backward of a piece of code, counted by wrapping it (saved_tensors_hooks), never by a counter inside it
(saved_bytes). The check of section 1: the ranks' pieces glued back into
the unsplit block's tensors (glue). Context parallelism: what a rank's ring attention costs, counted by wrapping the plain
code (FlopCounterMode for the matmuls, helpers.trace for the bytes sent), the key claim's assertion
(counted work per rank equals the causal layout's model), and the key figure; the pictures of the
ring's causal blocks: who computes each and at which step (the lecture's specification, drawn by
draw_blocks) and each rank's blocks per step as recorded from the run (draw_steps). It holds none of
the lecture's algorithm. Section 1's data (block_and_data) and section 5's run of the lecture's ring on
grouped-query attention, checked against torch's attention (gqa_run).
"""
import contextlib

import matplotlib.pyplot as plt
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers import plots, recording, tiny, trace


def saved_bytes(run, params=()):
    """Bytes autograd saves for backward while `run()` executes, counted by lecture 10's
    SavedBytes: each storage once (q, k and v are views of one qkv output), the parameters in
    `params` left out (they are not activations)."""
    from course.memory_precision import SavedBytes

    with SavedBytes(params) as saved:
        out = run()              # kept alive until counted: no saved storage is freed and reused
    del out
    return saved.bytes


def block_and_data(h, a, s, b=2, dev="cpu"):
    """Section 1's data: tiny's block of width h, a heads (seed 0), its LayerNorms moved off weight
    1 and bias 0 (a mistake with them shows), an input x and an upstream gradient up, (b, s, h)."""
    block = tiny.transformer(dim=h, heads=a, depth=1, seed=0, device=dev).blocks[0]
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in (*block.ln1.parameters(), *block.ln2.parameters()):
            p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype).to(dev))
    x, up = (torch.randn(b, s, h, generator=gen, dtype=torch.float64).to(dev) for _ in "xu")
    return block, x, up


def glue(pieces, how, rows):
    """The ranks' pieces of one tensor as the unsplit block's: "same" (whole on every rank: checked
    equal, float64), "sum" (partial sums over the ranks' tokens), "heads" (rows(r, K): rank r's rows
    of the qkv weight or bias), "cat0"/"cat1" (concatenated along that dimension)."""
    if how == "same":
        for p in pieces[1:]:
            torch.testing.assert_close(p, pieces[0], rtol=1e-12, atol=1e-12)
        return pieces[0]
    if how == "sum":
        return sum(pieces)
    if how == "heads":
        whole = torch.empty(sum(len(p) for p in pieces), *pieces[0].shape[1:], dtype=pieces[0].dtype)
        for r, p in enumerate(pieces):
            whole[rows(r, len(pieces))] = p
        return whole
    return torch.cat(pieces, dim=int(how[-1]))

@contextlib.contextmanager
def counted():
    """`with counted() as c:` around a rank's code; on exit c holds its matmul flops
    (FlopCounterMode), those of each ring step ("steps": from one pass's arrival to the next,
    helpers.recording) and the bytes its point-to-point sends carried (helpers.trace)."""
    out = {}
    with trace.calls() as log, FlopCounterMode(display=False) as flops:
        with recording.at_waits(flops.get_total_flops) as marks:
            yield out
    total = flops.get_total_flops()
    out.update(flops=total, steps=recording.per_step(marks, total), sent=log.nbytes("send"),
               sends=log.count("send"))


def _gqa_rank(rank, K, forward, chunks, q, k, v, n):
    from helpers.spawn import device
    mine = [torch.cat([x.narrow(-2, i * n, n) for i in chunks[rank]], dim=-2).to(device())
            for x in (q, k, v)]
    with counted() as fwd:
        out, _ = forward(*mine, chunks)
    return out.cpu(), fwd["sent"]


def gqa_run(forward, chunks, qkv, n, backend):
    """Section 5: `forward` (the lecture's ring_forward) on grouped-query attention shaped to
    broadcast: q (b, a_kv, a/a_kv, s, d), k and v (b, a_kv, 1, s, d). Each rank's output is checked
    against its chunks of torch's scaled_dot_product_attention(..., enable_gqa=True) on the whole
    sequence (float64); returns the bytes each rank sent."""
    import torch.nn.functional as F

    from helpers.spawn import spawn

    q, k, v = qkv
    b, a_kv, g, s, d = q.shape
    want = F.scaled_dot_product_attention(q.reshape(b, a_kv * g, s, d), k.squeeze(2), v.squeeze(2),
                                          is_causal=True, enable_gqa=True)
    runs = spawn(_gqa_rank, len(chunks), backend=backend, args=(forward, chunks, q, k, v, n))
    for mine, (out, _) in zip(chunks, runs):
        ours = torch.cat([want.narrow(-2, i * n, n) for i in mine], dim=-2)
        torch.testing.assert_close(out.reshape(ours.shape), ours, rtol=1e-12, atol=1e-12,
                                   msg=f"GQA with {a_kv} key/value heads, chunks {mine}")
    return [sent for _, sent in runs]


def assert_work(counted_flops, pairs, flops_per_pair, layout):
    """The key claim: every rank's counted matmul flops equal the model, its chunk pairs times
    the flops of one pair (both are counts: tolerance 0). counted_flops and pairs: per rank."""
    model = [p * flops_per_pair for p in pairs]
    assert list(counted_flops) == model, (
        f"{layout}: counted {list(counted_flops)} flops per rank, the model says {model}")


def imbalance(per_rank):
    """The slowest rank's share over the mean: what the ring's step time pays for imbalance."""
    return max(per_rank) / (sum(per_rank) / len(per_rank))


def draw_work(counted_by_layout, model_by_layout, title, unit=1e6):
    """Bars: counted flops per rank of each layout (in Mflop); black ticks: the model."""
    fig, ax = plots.figure(width=8, height=3.6)
    layouts = list(counted_by_layout)
    K = len(counted_by_layout[layouts[0]])
    width = 0.8 / len(layouts)
    for n, name in enumerate(layouts):
        xs = [r + (n - (len(layouts) - 1) / 2) * width for r in range(K)]
        ax.bar(xs, [f / unit for f in counted_by_layout[name]], width, color=plots.COLORS[n],
               label=f"{name}: counted")
        ax.plot(xs, [f / unit for f in model_by_layout[name]], "k_", ms=18, mew=2)
    ax.plot([], [], "k_", ms=12, mew=2, label="model: pairs x flops per pair")
    ax.set_xticks(range(K), [f"rank {r}" for r in range(K)])
    ax.set(ylabel="Mflop per rank (forward + backward)", title=title)
    ax.legend(fontsize=8)
    plt.show()


def per_step(spec, K):
    """A specification {(i, j): (rank, step)} as counts: [rank][step] = blocks that rank computes then."""
    out = [[0] * K for _ in range(K)]
    for rank, step in spec.values():
        out[rank][step] += 1
    return out


def draw_blocks(specs):
    """One panel per layout: query chunk i (rows) against key chunk j (columns); a block j <= i in
    the colour of the rank that computes it, with the ring step at which it does; the diagonal
    hatched (masked inside); j > i empty (skipped)."""
    fig, axes = plots.figure(ncols=len(specs), width=4.2 * len(specs), height=4.4)
    for ax, (name, spec) in zip(axes, specs.items()):
        n = max(i for i, _ in spec) + 1
        K = max(r for r, _ in spec.values()) + 1
        for (i, j), (rank, step) in spec.items():
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=plots.COLORS[rank],
                                       alpha=0.75, edgecolor="white", hatch="//" if i == j else None))
            ax.text(j, i, f"t={step}", ha="center", va="center", fontsize=8)
        pairs = [sum(row) for row in per_step(spec, K)]
        ax.set(xlim=(-0.5, n - 0.5), ylim=(n - 0.5, -0.5), xlabel="key chunk j",
               ylabel="query chunk i", title=f"{name}: blocks per rank {pairs}")
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.grid(False)
    for r in range(K):
        axes[-1].plot([], [], "s", color=plots.COLORS[r], alpha=0.75, label=f"rank {r}")
    axes[-1].legend(fontsize=8, loc="upper right")
    fig.suptitle("Ring attention's causal blocks: who computes each, at which step t (specification)")
    plt.tight_layout()
    plt.show()


def draw_steps(recorded):
    """One panel per layout: blocks each rank computed (rows) at each ring step (columns), as
    recorded from its flops; the bottom row is each step's slowest rank."""
    fig, axes = plots.figure(ncols=len(recorded), width=4.2 * len(recorded), height=3.2)
    for ax, (name, rows) in zip(axes, recorded.items()):
        K = len(rows)
        grid = rows + [[max(col) for col in zip(*rows)]]
        ax.imshow(grid, cmap="Greens", vmin=0, vmax=4)
        for r, row in enumerate(grid):
            for t, blocks in enumerate(row):
                ax.text(t, r, f"{blocks:g}", ha="center", va="center", fontsize=9)
        ax.axhline(K - 0.5, color="black", lw=1)
        ax.set_xticks(range(K))
        ax.set_yticks(range(K + 1), [f"rank {r}" for r in range(K)] + ["slowest"])
        ax.set(xlabel="ring step t", title=f"{name}: blocks per step (recorded)")
        ax.grid(False)
    plt.tight_layout()
    plt.show()
