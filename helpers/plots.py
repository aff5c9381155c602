"""One figure style for the whole series. Figures are drawn in the notebook process only."""
import math

import matplotlib.pyplot as plt

MEASURED = "tab:blue"
MODEL = "tab:orange"
REFERENCE = "tab:gray"
COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
          "tab:pink", "tab:olive"]


def style():
    plt.rcParams.update({"figure.figsize": (7, 4), "figure.dpi": 100, "axes.grid": True,
                         "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False,
                         "legend.frameon": False, "font.size": 10})


def figure(ncols=1, nrows=1, width=7, height=4, **kw):
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), **kw)
    return fig, axes


def bytes_label(n):
    """4096 -> '4 KiB', 780213.4 -> '761.9 KiB': four significant digits at most."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n:.4g} B"


def log2_size_axis(ax, sizes):
    """A log x axis labelled in bytes at the given sizes (at most 8 of them, evenly picked)."""
    ax.set_xscale("log", base=2)
    step = max(1, math.ceil(len(sizes) / 8))   # at most 8 labels
    ax.set_xticks(sizes[::step])
    ax.set_xticklabels([bytes_label(s) for s in sizes[::step]], rotation=30)
