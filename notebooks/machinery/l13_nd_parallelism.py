"""Running one training step on a DeviceMesh and attributing its collectives to the mesh's
dimensions: the machinery of the mesh lectures. It holds none of a lecture's code.

    runs = mesh_bench.run(parts, step, (2, 2), ("dp", "tp"), args=(...,))
    mesh_bench.per_dimension(runs[0]["log"], ("dp", "tp"))   # {dim: {kind: [calls, N, sent]}}

`run` starts prod(shape) ranks (helpers.spawn). Each rank builds the mesh, calls
`parts(mesh, *args)` (the model split on the mesh, the rank's data: anything its set-up
communicates is not counted), then `step(mesh, *parts)` inside `helpers.trace.calls(strict=True)`.
Every traced call must be on the group of one mesh dimension (`mesh_log`: any other group stops
the run); with `torch_count=True` torch's own `CommDebugMode` must count as many calls. A call's
bytes sent are helpers.trace's ring model, but an all-to-all's are counted from its split lists:
N less the rows the rank keeps (lecture 12's; an uneven exchange is no ring). What
`step` returns comes back assembled: every DTensor in it (a sharded gradient or parameter)
as its full tensor, its placements under "placements" ({"params.w": "(Shard(dim=0),)"}).
Figures: the bytes per dimension (draw_bytes) and each dimension's groups (draw_mesh).
"""
import contextlib
import math

import numpy as np
import torch.distributed as dist

from helpers import trace
from machinery import l12_expert_parallel as ep_bench
from helpers.spawn import device, spawn


def mesh_log(log, mesh, splits=None):
    """(dimension, kind, N, sent) per traced call, the dimension named by the call's group.
    splits: each all-to-all's input split sizes, in call order (the inputs of `ep_bench.splits`);
    then an all-to-all's sent is N less this rank's own split, else the ring's (n-1)/n N (even
    splits)."""
    dims = {mesh.get_group(d).group_name: d for d in mesh.mesh_dim_names}
    for c in log.calls:
        if c.group not in dims:
            raise RuntimeError(f"{c.op} on {c.group}, not a mesh dimension's group")
    todo = None if splits is None else list(splits)
    if todo is not None and len(todo) != sum(c.kind == "all_to_all" for c in log.calls):
        raise RuntimeError(f"{len(todo)} split lists for the log's all-to-alls")

    def sent(c):
        if c.kind != "all_to_all" or todo is None:
            return c.ring_sent
        split = todo.pop(0) or [1] * c.size                  # []: an even split
        row = c.nbytes // sum(split) if sum(split) else 0    # bytes of one row
        return c.nbytes - row * split[c.ranks.index(dist.get_rank())]
    return [(dims[c.group], c.kind, c.nbytes, sent(c)) for c in log.calls]


def per_dimension(log, names):
    """{dimension: {kind: [calls, N bytes, sent bytes]}} from a mesh log."""
    out = {d: {} for d in names}
    for dim, kind, N, sent in log:
        c = out[dim].setdefault(kind, [0, 0, 0])
        c[0], c[1], c[2] = c[0] + 1, c[1] + N, c[2] + sent
    return out


def quiet():
    """Silence four true, harmless notices (2-D full_tensor, a view, a hook, and DTensor's
    all-gather in place of an all-to-all on CPU, which the tracer counts)."""
    import logging
    import warnings

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    logging.getLogger("torch.distributed.tensor._collective_utils").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
    warnings.filterwarnings("ignore", message="Full backward hook is firing when")


def full(value):
    """`value` with every DTensor in it (dicts, lists, tuples) replaced by its full tensor."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.full_tensor().detach()
    if isinstance(value, dict):
        return {k: full(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(full(v) for v in value)
    return value


def placements(value, path=""):
    """{path: str(placements)} of every DTensor in `value` (dicts, lists, tuples), the path
    joining keys and indices with dots: {"params.blocks.0.w": "(Shard(dim=0), Replicate())"}."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return {path: str(value.placements)}
    items = (value.items() if isinstance(value, dict) else
             enumerate(value) if isinstance(value, (list, tuple)) else ())
    return {k: v for key, item in items
            for k, v in placements(item, f"{path}.{key}" if path else str(key)).items()}


def _rank(rank, K, parts, step, shape, names, args, torch_count):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    quiet()
    mesh = init_device_mesh(device().type, shape, mesh_dim_names=names)
    made = parts(mesh, *args)
    with CommDebugMode() if torch_count else contextlib.nullcontext() as torch_calls:
        with trace.calls(strict=True) as calls, ep_bench.splits() as splits:
            out = step(mesh, *made)
    log = mesh_log(calls, mesh, [inputs for inputs, _ in splits])
    if torch_count:
        assert torch_calls.get_total_counts() == len(log), torch_calls.get_comm_counts()
    return dict(full(out), log=log, placements=placements(out))


def run(parts, step, shape, names, args=(), backend="auto", torch_count=False):
    """Run `step` on a mesh of `shape` named `names`; per rank: step's dict (assembled) + log."""
    if len(shape) != len(names):
        raise ValueError(f"a mesh of shape {shape} needs {len(shape)} names, got {names}.")
    return spawn(_rank, math.prod(shape), backend=backend,
                 args=(parts, step, tuple(shape), tuple(names), tuple(args), torch_count))


def traced_nd3d(rank, world_size, dp, tp, pp, cfg, steps, micro_batches):
    """nd3d.train on this rank, wrapped in helpers.trace (strict: a call it cannot name fails): its
    result, and "traced" ({dim: bytes this rank sent per step}), every call read where torch sees
    it and put to the dimension whose group it ran on (by the group's name), not from nd3d's own
    bill. The one call allowed outside the mesh's groups is the losses' all-reduce on the world
    group after training (bookkeeping, the last call); any other fails the run."""
    import nd3d

    with trace.calls(strict=True) as log:
        res = nd3d.train(rank, world_size, dp, tp, pp, cfg, steps, micro_batches)
    dims = {res["group_names"][d]: d for d in nd3d.DIMS if len(res["groups"][d]) > 1}
    sent = {d: 0 for d in nd3d.DIMS}
    *training, last = log.calls
    assert last.kind == "all_reduce" and last.group == dist.group.WORLD.group_name, last
    for c in training:                        # (a dimension spanning the world is the world's group)
        if c.group not in dims:
            raise RuntimeError(f"{c.op} on {c.group} (ranks {c.ranks}): not a mesh dimension's group")
        sent[dims[c.group]] += c.ring_sent
    res["traced"] = {d: b / steps for d, b in sent.items()}
    return res


def table(counted, model):
    """Print counted calls and bytes per dimension and collective beside the model's bytes
    sent; both as per_dimension gives them ({dim: {kind: [calls, N, sent]}})."""
    from helpers import report

    cols = ["dimension", "collective", "calls", "N bytes", "sent/rank", "model sent"]
    modelled = {(dm, k): v[2] for dm, kinds in model.items() for k, v in kinds.items()}
    report.table([dict(zip(cols, (dm, k, c, n, s, modelled.get((dm, k), "-"))))
                  for dm, kinds in counted.items() for k, (c, n, s) in kinds.items()], cols)


def draw_bytes(counted, model, names, coords, title):
    """Bars: the bytes (N, KiB) of each rank's calls per mesh dimension, counted; black ticks:
    the model's. counted, model: per rank, as per_dimension gives them; coords: per rank.
    N, not bytes sent: on a dimension of two ranks an all-to-all's sent is the pair's exchange,
    alike on both, while N holds the rows a rank's experts computed (its load)."""
    import matplotlib.pyplot as plt

    from helpers import plots

    fig, ax = plots.figure(width=9, height=3.4, layout="constrained")
    width = 0.81 / len(names)
    xs = [float(r) for r in range(len(counted))]
    for i, (dim, color) in enumerate(zip(names, plots.COLORS[1:])):
        at = [x + (i - (len(names) - 1) / 2) * width for x in xs]
        ax.bar(at, [sum(v[1] for v in got[dim].values()) / 1024 for got in counted], width,
               color=color, label=f'"{dim}"')
        ax.plot(at, [sum(v[1] for v in m[dim].values()) / 1024 for m in model], "_",
                color="black", ms=16, mew=2)
    ax.set_xticks(xs, [str(tuple(c)) for c in coords])
    ax.set(xlabel=f"rank's ({', '.join(names)}) coordinate", ylabel="KiB in its calls (N)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    ax.set_title(title)
    plt.show()


def _place(rank, shape):
    """(x, y) of a rank on the page: the last coordinate across, the one before it down, a first
    of three dimensions as blocks side by side."""
    coord = [int(c) for c in np.unravel_index(rank, shape)]          # row-major, as the mesh
    block = coord[0] * (shape[-1] + 0.8) if len(shape) == 3 else 0
    return block + coord[-1], coord[-2] if len(shape) >= 2 else 0


def draw_mesh(groups, shape, source):
    """groups: {dimension name: [[ranks of one group], ...]}; one panel per dimension, each group
    a line through its ranks in its own colour; source: what the groups come from (the title):
    the rule's groups and a run's, drawn alike to be held side by side."""
    import matplotlib.pyplot as plt

    from helpers import plots

    n = math.prod(shape)
    fig, axes = plots.figure(ncols=len(groups), width=3.6 * len(groups), height=2.6)
    for ax, (name, lines) in zip(axes, groups.items()):
        for g, members in enumerate(lines):
            for a, b in zip(members, members[1:]):        # neighbours in the group, joined
                (xa, ya), (xb, yb) = _place(a, shape), _place(b, shape)
                bend = 0.0 if abs(xb - xa) + abs(yb - ya) <= 1 else 0.3   # around the ranks between
                ax.annotate("", xy=(xb, yb), xytext=(xa, ya), arrowprops=dict(
                    arrowstyle="-", lw=6, alpha=0.45, color=plots.COLORS[g % len(plots.COLORS)],
                    connectionstyle=f"arc3,rad={bend}", shrinkA=0, shrinkB=0))
        for r in range(n):
            x, y = _place(r, shape)
            ax.text(x, y, str(r), ha="center", va="center", fontsize=10,
                    bbox=dict(boxstyle="circle", facecolor="white", edgecolor="gray"))
        sizes = sorted({len(m) for m in lines})
        ax.set_title(f'"{name}": {len(lines)} groups of {"/".join(map(str, sizes))}', fontsize=10)
        xs, ys = zip(*(_place(r, shape) for r in range(n)))
        ax.set(xlim=(min(xs) - 0.6, max(xs) + 0.6), ylim=(max(ys) + 0.6, min(ys) - 0.6))
        ax.set_aspect("equal")
        ax.axis("off")
    fig.suptitle(f"Mesh {tuple(shape)}, each dimension's process groups ({source})", fontsize=11)
    plt.tight_layout()
    plt.show()
