"""A planner for N-D parallel training (lecture 14): memory per GPU and step time of every layout
(dp, tp, pp, and optionally cp, ep, interleaved chunks and unequal stages), ZeRO stage, micro-batch size
and recomputation, from the lectures' formulas only.

    from machinery import l14_planner as planner
    model = {"layers": 96, "hidden": 12288, "heads": 96, "vocab": 51200, "seq": 2048, "params": None}
    cluster = {"gpus_per_node": 8, "nodes": 128, "memory": 80e9, "peak_flops": 989e12, "efficiency": 0.5,
               "intra_bw": 450e9, "intra_alpha": 5e-6, "inter_bw": 50e9, "inter_alpha": 10e-6}
    ranked = planner.plan(model, cluster, global_batch=1536)    # feasible configurations, fastest first
    print(planner.describe(ranked[0]))                          # its time and memory broken down
    planner.plan(model, cluster, 1536, chunks=(1, 2, 4), cps=(1, 2), uneven=True, main_grads=True)

    # nd3d.train's step on one DGX H100 node, the tiny GPT standing for one 128 times larger
    planner.predict(nd3d.CFG, 128, dp=2, tp=2, pp=2, micro_batches=4)   # {"total": s, ...}
    planner.traffic(model, 1536, 1, dp=64, tp=8, pp=2, zero=3)   # {"tensor": {"calls", "bytes", ...}, ...}

One model, in modules whose imports run one way (each imports only those above it):
    counts.py    FLOPs, layers and parameters per stage, collective calls and bytes (traffic)
    memory.py    memory per GPU, from the counts
    step.py      the step time of a layout, from the counts and the memory; the plan over layouts
    modelled.py  nd3d's tiny GPT, S times larger, on one node of a helpers.machines model, predicted
    paper.py     published tables (GPT-3, Narayanan et al. 2021) priced by the planner
    plots.py     the lecture's figures; fake_mesh.py: one step of a 1,024-rank layout counted by torch
This package re-exports the public names of counts, memory, step and modelled: planner.<name>.

Layouts follow Megatron-LM: tp innermost, then cp, then dp (expert parallelism: ep of the dp x cp
ranks), then pp, so a tensor-parallel group is tp consecutive GPUs of one node, a context-parallel group
strides by tp, a data-parallel group by tp cp, pipeline neighbours are tp cp dp apart.
model:   layers, hidden, heads, vocab, seq, params (None: Narayanan et al. 2021's Eq. 2); optional
         keys placing the parameters on the stages, and experts / top_k: counts.py.
cluster: gpus_per_node, nodes, memory (bytes), reserve (fraction of memory kept free, default 0),
         peak_flops, efficiency, intra_bw / inter_bw (bytes/s per GPU per direction, lecture 00's
         convention; inter_bw is one GPU's own NIC), intra_alpha / inter_alpha (s); optional
         p2p_bw / p2p_alpha (the pipeline's messages' link).
         Sizes in bytes, times in seconds, FLOPs as counts.
"""
from machinery.l14_planner.counts import (BF16, DIMENSIONS, comm_time, executed_flops,  # noqa: F401
                                          fullest_stage, layer_params, paper_flops, param_count,
                                          ring_all_gather, ring_all_reduce, stage_flops, stage_layers,
                                          stage_param_split, stage_params, stage_splits, traffic)
from machinery.l14_planner.memory import activation_bytes_per_layer, memory  # noqa: F401
from machinery.l14_planner.step import (RECOMPUTE, backward_share, best_per_layout, check,  # noqa: F401
                                        describe, evaluate, layouts, plan, split_label, step_time)
from machinery.l14_planner.modelled import (nd3d_layouts, node_cluster, predict, scaled_model,  # noqa: F401
                                            tiny_model)
