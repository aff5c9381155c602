"""The before/after picture of a collective: what every rank holds before a call and after it.

    from machinery import l01_diagrams as diagrams
    diagrams.before_after("all-reduce (SUM)", before, after, reduced=True)

`before` and `after` hold one value per rank, as the ranks returned them: a tensor, a list of tensors
(drawn with a gap between them) or None (no buffer). One row per rank, one box per element. Before
the call a box has its rank's colour (its owner). After it, a box takes the colour of the only rank
that held its value before the call, so the data can be followed; white where several ranks held
that value; grey where no single rank held it (a sum), and every box after a reduction
(`reduced=True`).
The ranks listed in `undefined` hold values a program must not read: drawn hatched, in grey.
It only draws: the values come from the ranks. Figures are drawn in the notebook process.
"""
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from helpers import plots

GAP = 0.3          # space between two tensors of one rank's list, in boxes
GREY = "0.8"       # a value no single rank held, or a reduction's result


def cells(value):
    """[(number, index of its tensor)] for a tensor, a list of tensors, or None."""
    if value is None:
        return []
    parts = value if isinstance(value, (list, tuple)) else [value]
    return [(v, i) for i, t in enumerate(parts) for v in t.reshape(-1).tolist()]


def owners(before):
    """{value: the ranks that held it before the call}."""
    out = {}
    for rank, value in enumerate(before):
        for v, _ in cells(value):
            out.setdefault(v, set()).add(rank)
    return out


def colour(v, held_by, reduced):
    """A rank's colour when exactly one rank held v before the call, white when several did, else grey."""
    if reduced or not held_by.get(v):
        return GREY
    who = held_by[v]
    return rank_colour(min(who)) if len(who) == 1 else "white"


def rank_colour(rank):
    """The colour of a rank's own boxes (before the call)."""
    return plots.COLORS[rank % len(plots.COLORS)]


def label(v):
    return str(int(v)) if float(v).is_integer() else f"{v:.3g}"


def _width(rows):
    return max([1] + [len(c) + GAP * c[-1][1] for c in rows if c])


def _draw_side(ax, rows, held_by, reduced, undefined, title, by_owner=False):
    k = len(rows)
    for r, row in enumerate(rows):
        y, hidden = k - 1 - r, r in undefined
        for i, (v, part) in enumerate(row):
            fill = rank_colour(r) if by_owner else colour(v, held_by, reduced)
            x = i + GAP * part
            ax.add_patch(Rectangle((x, y + 0.05), 0.92, 0.86, lw=0.6,
                                   facecolor="0.97" if hidden else fill, hatch="//" if hidden else None,
                                   ls="--" if hidden else "-", edgecolor="0.6" if hidden else "black",
                                   alpha=0.45 if fill not in ("white", GREY) and not hidden else 1))
            ax.text(x + 0.46, y + 0.48, label(v), ha="center", va="center", fontsize=8,
                    color="0.45" if hidden else "black",
                    bbox=dict(fc="0.97", ec="none", pad=0.5) if hidden else None)
        if not row:
            ax.text(0.05, y + 0.48, "(no buffer)", va="center", fontsize=8, color="0.4")
    ax.set_xlim(-0.05, _width(rows) + 0.05)
    ax.set_ylim(0, k)
    ax.set_yticks([k - 1 - r + 0.48 for r in range(k)],
                  [f"rank {r}" + (" (undefined)" if r in undefined else "") for r in range(k)])
    ax.set_xticks([])
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(title)


def figure(title, before, after, reduced=False, undefined=()):
    """The picture of every rank's buffers before and after a call, side by side (not shown)."""
    rows = {"before": [cells(v) for v in before], "after": [cells(v) for v in after]}
    held_by = owners(before)
    widths = [_width(rows["before"]), _width(rows["after"])]
    fig, axes = plt.subplots(1, 2, figsize=(min(15, 2.2 + 0.42 * sum(widths)), 0.7 + 0.42 * len(before)),
                             gridspec_kw={"width_ratios": widths})
    _draw_side(axes[0], rows["before"], held_by, False, (), "before", by_owner=True)
    _draw_side(axes[1], rows["after"], held_by, reduced, set(undefined), "after")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def before_after(title, before, after, reduced=False, undefined=()):
    """Show the picture (see `figure`)."""
    figure(title, before, after, reduced, undefined)
    plt.show()
