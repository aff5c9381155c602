"""Printing results the same way in every lecture: per rank, and as tables."""


def _fmt(value):
    import torch

    if isinstance(value, torch.Tensor):
        return str(value.tolist()) if value.numel() <= 16 else f"tensor{tuple(value.shape)}"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def by_rank(title, values):
    """Print one line per rank: `title`, then `rank r: value`."""
    print(title)
    for rank, value in enumerate(values):
        print(f"  rank {rank}: {_fmt(value)}")


def table(rows, columns, floatfmt="{:.4g}"):
    """Print a list of dicts (or tuples) as an aligned text table with the given columns."""
    cells = [[c for c in columns]]
    for row in rows:
        vals = [row[c] for c in columns] if isinstance(row, dict) else list(row)
        cells.append([floatfmt.format(v) if isinstance(v, float) else str(v) for v in vals])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    for i, r in enumerate(cells):
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
