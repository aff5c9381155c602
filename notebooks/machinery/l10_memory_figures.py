"""Lecture 10's figures: what one transformer block keeps for the backward, tensor by tensor in
the order the forward saves them (draw_saves: section 1's table as a specification, and the
storages a saved-tensor hook recorded from a run, memory_bench.record_saves), and the bytes kept
and the step's peak over the sequence length against the formulas (draw_saved_vs_s). They hold
none of the lecture's code: the formulas and the measurements are handed in.
"""
import matplotlib.pyplot as plt

from helpers import plots

GROUPS = {"qkv": "linear input", "proj": "linear input", "fc1": "linear input",
          "q": "attention: q, k, v", "k": "attention: q, k, v", "v": "attention: q, k, v",
          "mask": "causal mask", "softmax": "softmax: a s^2 b", "GELU": "MLP (4h wide)",
          "fc2": "MLP (4h wide)"}


def _group(name):
    first = name.split()[0]
    return "LayerNorm" if first.startswith("ln") else GROUPS.get(first, "other")


def draw_saves(rows_by_label, title):
    """One bar per list of (name, bytes): each saved tensor a segment as wide as its bytes, in the
    order saved, coloured by what keeps it; a recorded list names shapes, not ops, so its segments
    take the colours of the first list's at the same places."""
    fig, ax = plots.figure(width=12, height=1.6 + 0.55 * len(rows_by_label))
    names = [n for n, _ in next(iter(rows_by_label.values()))]
    kinds = list(dict.fromkeys(_group(n) for n in names))
    for y, (label, rows) in enumerate(rows_by_label.items()):
        left = 0
        for i, (name, nbytes) in enumerate(rows):
            kind = _group(names[i]) if i < len(names) else "other"
            ax.barh(y, nbytes, left=left, color=plots.COLORS[kinds.index(kind) % len(plots.COLORS)],
                    edgecolor="white", height=0.6)
            if nbytes > 0.06 * sum(n for _, n in rows):
                ax.text(left + nbytes / 2, y, name, ha="center", va="center", fontsize=7)
            left += nbytes
    ax.set_yticks(range(len(rows_by_label)), list(rows_by_label))
    ax.set(ylim=(len(rows_by_label) - 0.5, -0.5), title=title,
           xlabel="bytes kept for the backward, each tensor in the order the forward saved it")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=plots.COLORS[i % len(plots.COLORS)], label=k)
                       for i, k in enumerate(kinds)], fontsize=7, ncol=len(kinds), loc="upper center",
              bbox_to_anchor=(0.5, -0.3 - 0.1 / len(rows_by_label)), frameon=False)
    ax.grid(False)
    plt.show()


def draw_saved_vs_s(seqs, saved_bf16, peaks, dim, heads, dW, forms):
    """Left: bytes saved per block (bf16) over s, measured (points) and the formulas (lines), in
    units of sbh w; right: what the forward left alive and the step's peak (float64), with the
    fused block's peak bound. saved_bf16: {"explicit"/"fused": [bytes per s]}; peaks: {s: {core:
    {"kept", "peak"}}}; forms: {"explicit"/"fused": formula(s, b, h, a, w) -> {term: bytes}}."""
    fig, (ax, bx) = plots.figure(ncols=2, width=12, height=4.2)
    unit = lambda s, e: s * dim * e                  # sbh w bytes (b = 1)  # noqa: E731
    for core, color, c in (("explicit", plots.COLORS[2], "attention"), ("fused", plots.COLORS[4], "sdpa")):
        ax.plot(seqs, [v / unit(s, 2) for s, v in zip(seqs, saved_bf16[core])], "o", color=color,
                label=core)
        ax.plot(seqs, [sum(forms[core](s, 1, dim, heads, 2).values()) / unit(s, 2) for s in seqs],
                "-", color=color, alpha=0.6, label=f"{core}: formula")
        for k, style in (("kept", "o-"), ("peak", "s--")):
            bx.plot(seqs, [peaks[s][c][k] / unit(s, 8) for s in seqs], style, color=color,
                    label=f"{core}: {k}")
    bx.plot(seqs, [(peaks[s]["sdpa"]["kept"] + dW) / unit(s, 8) + 8 for s in seqs], ":",
            color=plots.COLORS[4], label="fused: peak bound (model)")
    ax.set(xlabel="sequence length s", ylabel="saved, in sbh w (bf16)",
           title=f"saved for backward, one block, h={dim}, a={heads}, b=1")
    bx.set(xlabel="sequence length s", ylabel="bytes alive, in sbh w (float64)",
           title="kept after the forward, and the step's peak")
    for a_ in (ax, bx):
        a_.set(xscale="log", ylim=(0, None))
        a_.set_xticks(seqs, seqs)
        a_.minorticks_off()
        a_.legend(fontsize=8)
    plt.show()
