"""The planner on a modelled machine (lecture 14, section 4): nd3d's tiny GPT, S times larger, as a
planner model (tiny_model, scaled_model), a DGX H100 node of helpers.machines as a planner cluster
(node_cluster), the layouts nd3d runs (layouts), and nd3d.train's step predicted by
planner.step_time (predict)."""
from helpers import machines
from machinery.l14_planner.counts import stage_splits
from machinery.l14_planner.step import layouts, step_time


def tiny_model(cfg, head_split=False):
    """The planner's model dict of nd3d's tiny GPT (cfg: vocab, dim, heads, depth, seq, batch,
    max_seq: 64 unless given), its parameters placed as nd3d places them: per block the column- and
    row-parallel weights and the column-parallel biases split over tp (12 h^2 + 7 h), the norms and
    the row-parallel biases whole (6 h); token and position embeddings whole on the first stage; the
    head (h V + V, split if head_split) and the final norm (2 h) on the last; a pipeline send carries
    the whole activation."""
    h, V = cfg["dim"], cfg["vocab"]
    return {"layers": cfg["depth"], "hidden": h, "heads": cfg["heads"], "vocab": V, "seq": cfg["seq"],
            "params": None, "layer_split": 12 * h * h + 7 * h, "layer_whole": 6 * h,
            "embed": (V + cfg.get("max_seq", 64)) * h, "embed_split": False, "head": h * V + V,
            "head_split": head_split, "head_whole": 2 * h, "p2p_split": False}


def scaled_model(cfg, scale):
    """tiny_model of the GPT the tiny one stands for: width, sequence, vocabulary and positions x
    scale (the batch, the depth and the heads as they are)."""
    return tiny_model(dict(cfg, dim=cfg["dim"] * scale, seq=cfg["seq"] * scale,
                           vocab=cfg["vocab"] * scale, max_seq=cfg.get("max_seq", 64) * scale))


def node_cluster(machine=machines.H100):
    """One node of `machine` as a planner cluster: its achieved GEMM rate (efficiency 1), NCCL's
    ring step on NVLink (alpha of the Simple protocol, the ring's B) for every group and message."""
    alpha, bw = machines.link(machine)
    return {"gpus_per_node": machine.gpus_per_node, "nodes": 1, "memory": machine.memory,
            "peak_flops": machine.gemm_flops, "efficiency": 1.0,
            "intra_bw": bw, "intra_alpha": alpha, "inter_bw": bw, "inter_alpha": alpha}


def predict(cfg, scale, dp, tp, pp, micro_batches, stages=None, machine=machines.H100, **options):
    """planner.step_time of nd3d.train's step (no ZeRO, no recomputation, bf16) on the tiny GPT
    `scale` times larger, on one node of `machine`: compute, tensor, p2p, bubble, data (seconds).
    stages: layers per pipeline stage (None: equal). `options` go to step_time (e.g. overlap=1.0)."""
    b = cfg["batch"] // (dp * micro_batches)
    return step_time(scaled_model(cfg, scale), node_cluster(machine), cfg["batch"], b, dp, tp, pp,
                     zero=0, recompute="none", stages=stages, **options)


def nd3d_layouts(k, cfg):
    """Every (dp, tp, pp, m, stages) of k ranks that nd3d's tiny GPT `cfg` splits into: tp dividing
    the heads, pp the depth; m = 2 micro-batches without a pipeline, m = p and 2p with one; every
    data-parallel rank getting whole micro-batches; stages None (equal). Then one uneven split:
    the first of these with p >= 3 and m = 2p again, with fewer layers on the first and the last
    stage (planner.stage_splits' first unequal split)."""
    out = []
    for dp, tp, pp in layouts(k, k, cfg["heads"], cfg["depth"]):
        out += [(dp, tp, pp, m, None) for m in ((2,) if pp == 1 else (pp, 2 * pp))
                if cfg["batch"] % (dp * m) == 0]
    for dp, tp, pp, m, _ in out:
        uneven = [s for s in stage_splits(cfg["depth"], pp) if len(set(s)) > 1]
        if pp >= 3 and m == 2 * pp and uneven:
            return out + [(dp, tp, pp, m, uneven[0])]
    return out
