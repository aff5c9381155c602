"""Lecture 02's published curves (lecture 03 reuses them): what others measured of NCCL's
all-reduce on H100 nodes (data/published/, each file with its citation) set beside the H100 model's
ring (helpers.machines, NCCL's tuning model with the datasheet's NVLink) and beside the lecture's own
ring run on the H100 model's paced link; the model's ring plateau asserted against the published
one. It draws and checks; the ring itself is the lecture's.
"""
import numpy as np

from helpers import cost, machines, plots

CURVES = {"h100_8gpu_all_reduce_dgxc": "8 H100, NVIDIA's sample (algorithm not stated)",
          "h100_8gpu_all_reduce_nvls_azure": "8 H100, NVLS (Azure)",
          "h100_16gpu_2node_all_reduce_aws": "16 H100 on 2 nodes (AWS EFA)"}


def model_curve(sizes, k=8, nodes=1, machine=machines.H100, protocol=None):
    """The model's all-reduce busbw at each size (GB/s): NCCL's tuning model of the ring."""
    return [cost.busbw("all_reduce", n, machines.ring_all_reduce(machine, n, k, nodes, protocol), k)
            for n in sizes]


def ring_statements(machine="H100", algorithm="ring"):
    """[(low, high, source)] of the published busbw plateaus of `algorithm` on one node."""
    doc = machines.published("ring_busbw_statements")
    col = {c: i for i, c in enumerate(doc["columns"])}
    return [(r[col["busbw_low"]], r[col["busbw_high"]], r[col["source"]]) for r in doc["rows"]
            if r[col["machine"]] == machine and r[col["algorithm"]] == algorithm]


def assert_plateau(machine=machines.H100, tol=0.05):
    """The claim: the ring's published plateau on 8 GPUs of `machine` is the model's ring busbw at
    4 GiB within `tol`, the model's B being NCCL's own figure per NVLink (machines.ring_bw, from
    NCCL's topo.h: not fitted to these runs). Returns (model, [published]) in GB/s."""
    model = model_curve([2**32], machine=machine)[0]
    published = [0.5 * (a + b) for a, b, _ in ring_statements(machine.name.split()[-1])]
    assert published, f"no published ring plateau for {machine.name}"
    for p in published:
        assert abs(p / model - 1) <= tol, \
            f"{machine.name}: published ring busbw {p:.0f} GB/s, the model's {model:.0f} GB/s"
    return model, published


def draw(ax, ours=None):
    """busbw against size: the published curves (green, red, purple), the ring's published plateau
    on 8 H100s (a gray bar over the sizes it was stated at), the model's ring on 8 GPUs and on 2
    nodes (orange), and `ours`: [(label, [(size, busbw)])] of this lecture's runs on the model
    (blue squares)."""
    sizes = 2.0 ** np.arange(3, 35)
    for i, (name, label) in enumerate(CURVES.items()):
        rows = machines.published(name)["rows"]
        ax.plot([r[0] for r in rows], [r[-1] for r in rows], "o-", ms=3, lw=1,
                color=plots.COLORS[2 + i], label=f"published: {label}")
    for low, high, _ in ring_statements()[:1]:
        ax.plot([2**31, 2**34], [0.5 * (low + high)] * 2, color=plots.REFERENCE, lw=6, alpha=0.6,
                solid_capstyle="butt", label=f"published: ring plateau, 8 H100 ({low}-{high})")
    ax.plot(sizes, model_curve(sizes), color=plots.MODEL, label="model: ring, 8 H100, NVLink")
    ax.plot(sizes, model_curve(sizes, k=16, nodes=2), color=plots.MODEL, ls="--",
            label="model: ring, 16 H100 on 2 nodes")
    for label, points in ours or []:
        ax.plot([n for n, _ in points], [b for _, b in points], "s", color=plots.MEASURED,
                label=label)
    plots.log2_size_axis(ax, sizes)
    ax.set_yscale("log")
    ax.set(xlabel="N (bytes)", ylabel="busbw (GB/s)", ylim=(0.1, 1000))
    ax.legend(fontsize=7, loc="upper left")
