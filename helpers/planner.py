"""A planner for N-D parallel training (lecture 14): memory per GPU and step time of every (dp, tp, pp)
layout, ZeRO stage, micro-batch size and recomputation, from the lectures' formulas only.

    from helpers import planner
    model = {"layers": 96, "hidden": 12288, "heads": 96, "vocab": 51200, "seq": 2048, "params": None}
    cluster = {"gpus_per_node": 8, "nodes": 128, "memory": 80e9, "peak_flops": 989e12, "efficiency": 0.5,
               "intra_bw": 450e9, "intra_alpha": 5e-6, "inter_bw": 50e9, "inter_alpha": 10e-6}
    ranked = planner.plan(model, cluster, global_batch=1536)    # feasible configurations, fastest first
    print(planner.describe(ranked[0]))                          # its time and memory broken down

    # this machine: compute, alpha and B measured in the ranks, nd3d.train's 3D step predicted and timed
    runs = spawn(planner.run_rank, 2, args=(nd3d.train, nd3d.CFG, [(2, 1, 1), (1, 2, 1)], 4, 2, 3, sizes))
    machine, rows, median_error = planner.compare(runs, nd3d.CFG, micro_batches=2)
    planner.tiny_step_time(nd3d.CFG, machine, dp=1, tp=2, pp=1, micro_batches=2)   # {"total": s, ...}
    planner.traffic(model, 1536, 1, dp=64, tp=8, pp=2, zero=3)   # {"tensor": {"calls", "bytes", ...}, ...}

One model: the counts (FLOPs, parameters per stage, collective calls and bytes) are in
helpers/planner_counts.py, memory and time here, this machine's figures and check in
helpers/planner_machine.py; all of them are reached as planner.<name>.

Layouts follow Megatron-LM: tp innermost, then dp, then pp, so a tensor-parallel group is tp
consecutive GPUs of one node, a data-parallel group strides by tp, pipeline neighbours are tp*dp apart.
model:   layers, hidden, heads, vocab, seq, params (None: Narayanan et al. 2021's Eq. 2); optional
         keys placing the parameters on the stages: helpers/planner_counts.py.
cluster: gpus_per_node, nodes, memory (bytes), reserve (fraction of memory kept free, default 0),
         peak_flops, efficiency, intra_bw / inter_bw (bytes/s per GPU per direction, lecture 00's
         convention; inter_bw is one GPU's own NIC), intra_alpha / inter_alpha (s); optional c0 (s, a
         pass's fixed cost), p2p_bw / p2p_alpha (the pipeline's messages' link).
         Sizes in bytes, times in seconds, FLOPs as counts.
"""
from helpers.cost import ring_all_gather, ring_all_reduce  # noqa: F401 (one definition of the ring)
from helpers.planner_counts import (BF16, DIMENSIONS, comm_time, executed_flops, paper_flops,  # noqa: F401
                                    param_count, stage_flops, stage_params, traffic)

RECOMPUTE = ("none", "selective", "full")


# ---------------------------------------------------------------------------------- layouts

def layouts(gpus, gpus_per_node, heads, layers):
    """Every (dp, tp, pp) with dp*tp*pp = gpus, tp dividing the node and the heads (lecture 07: whole
    heads per rank; tensor parallelism stays on NVLink) and pp dividing the layers (lecture 08)."""
    out = []
    for tp in range(1, gpus_per_node + 1):
        if gpus_per_node % tp or heads % tp or gpus % tp:
            continue
        for pp in range(1, layers + 1):
            if layers % pp == 0 and (gpus // tp) % pp == 0:
                out.append((gpus // (tp * pp), tp, pp))
    return out


def check(model, cluster, global_batch, micro_batch, dp, tp, pp, chunks=1):
    """The reason a configuration cannot run, or None."""
    g = cluster["gpus_per_node"] * cluster["nodes"]
    if dp * tp * pp != g:
        return f"dp*tp*pp = {dp * tp * pp}, not the {g} GPUs"
    if tp > cluster["gpus_per_node"] or cluster["gpus_per_node"] % tp:
        return f"tp={tp} would leave the node of {cluster['gpus_per_node']} GPUs"
    if model["heads"] % tp:
        return f"tp={tp} does not divide the {model['heads']} heads"
    if model["layers"] % (pp * chunks):
        return f"pp*chunks={pp * chunks} does not divide the {model['layers']} layers"
    if global_batch % (dp * micro_batch):
        return f"dp*micro_batch={dp * micro_batch} does not divide the batch {global_batch}"
    if chunks > 1 and (global_batch // (dp * micro_batch)) % pp:
        return "the interleaved schedule needs m to be a multiple of pp (paper, section 2.2.2)"
    return None


# ----------------------------------------------------------------------------------- memory

def activation_bytes_per_layer(model, micro_batch, tp, recompute, sequence_parallel):
    """Bytes one layer keeps for one micro-batch, 16-bit, Korthikanti et al. 2022 (lecture 10, s. 6):
    sbh(34 + 5as/h) none, 34 sbh selective, 2 sbh full, all divided by t with sequence parallelism;
    tensor parallelism alone leaves 10 sbh (norms, dropouts, inputs) whole: sbh(10 + 24/t + 5as/(ht))."""
    s, h, a, b = model["seq"], model["hidden"], model["heads"], micro_batch
    sbh, attn = s * b * h, 5 * a * s / h
    if sequence_parallel or tp == 1:
        return sbh * {"none": 34 + attn, "selective": 34, "full": 2}[recompute] / tp
    return sbh * {"none": 10 + (24 + attn) / tp, "selective": 10 + 24 / tp, "full": 2}[recompute]


def memory(model, cluster, global_batch, micro_batch, dp, tp, pp, zero, recompute,
           sequence_parallel=True, chunks=1):
    """Bytes per GPU of the first pipeline stage (the fullest: the word embedding and min(p, m) micro-
    batches in flight), broken down."""
    local = stage_params(model, tp, pp)                      # tp and pp split the weights (07, 08)
    params = BF16 * local / (dp if zero >= 3 else 1)         # lecture 06's table: bf16 2 + 2 + 12
    grads = BF16 * local / (dp if zero >= 2 else 1)
    optim = 12 * local / (dp if zero >= 1 else 1)
    m = global_batch // (dp * micro_batch)
    in_flight = min(pp, m)                                   # 1F1B: stage 0 holds min(p, m) (lecture 08)
    if chunks > 1:                                           # interleaving (Korthikanti et al. 2022, 4.2.3;
        in_flight *= 1 + (pp - 1) / (pp * chunks)            # not re-read here)
    per_layer = activation_bytes_per_layer(model, micro_batch, tp, recompute, sequence_parallel)
    acts = model["layers"] // pp * per_layer * in_flight
    working = 0.0                                            # lecture 10, section 6: working memory
    if recompute != "none":                                  # one layer rematerialised at a time
        working += activation_bytes_per_layer(model, micro_batch, tp, "none", sequence_parallel)
    if zero >= 3:                                            # a layer's gathered weights and grads, x2 prefetch
        working += 2 * 2 * BF16 * 12 * model["hidden"] ** 2 / tp
    total = params + grads + optim + acts + working
    return {"params": params, "grads": grads, "optim": optim, "activations": acts,
            "working": working, "total": total}


# -------------------------------------------------------------------------------------- time

def _link(cluster, span):
    """(bandwidth, alpha) of a group spanning `span` consecutive ranks: NVLink inside a node, the
    network across (lecture 00's hierarchy)."""
    if span <= cluster["gpus_per_node"]:
        return cluster["intra_bw"], cluster["intra_alpha"]
    return cluster["inter_bw"], cluster["inter_alpha"]


def _only(dim, kind):
    """The calls of one kind of a traffic() entry, as an entry comm_time prices."""
    return {"kind": {kind: dim["kind"][kind]}, "kind_bytes": {kind: dim["kind_bytes"][kind]}}


def backward_share(model, micro_batch, tp, pp, recompute):
    """The share of a stage's compute that runs after its forward (the backward and, with
    recomputation, the recomputed forward in it): 2/3 without recomputation, 3/4 with a full one."""
    forward = stage_flops(model, micro_batch, tp, pp, "none") / 3
    return 1 - forward / stage_flops(model, micro_batch, tp, pp, recompute)


def step_time(model, cluster, global_batch, micro_batch, dp, tp, pp, zero, recompute,
              overlap=0.0, chunks=1, sequence_parallel=False, element=BF16):
    """Seconds of one training step on every GPU, broken down. Per micro-batch the busiest stage
    computes for c0/p (the cluster's fixed cost of a pass, 0 unless given: its stage's share) plus
    stage_flops / (peak x efficiency); every collective of traffic() costs the ring formula of its S
    on the link its group spans (the pipeline's sends on p2p_bw / p2p_alpha when the cluster has them);
    the pipeline runs m v + p - 1 slots of (compute + tensor + sends) / (m v) (lecture 08); the data-
    parallel traffic comes last, and `overlap` of what a backward can hide ("overlappable": all of it
    but ZeRO-1/2's parameter all-gather) is hidden, at most the backward compute it runs beside
    (backward_share; ZeRO-0/1's once-per-step reduction: the last micro-batch's): the rest is exposed."""
    g, m = dp * tp * pp, global_batch // (dp * micro_batch)
    rate = cluster["peak_flops"] * cluster["efficiency"]
    flops = stage_flops(model, micro_batch, tp, pp, recompute)
    compute = m * (cluster.get("c0", 0.0) / pp + flops / rate)
    moved = traffic(model, global_batch, micro_batch, dp, tp, pp, zero, recompute, chunks, element,
                    sequence_parallel)
    tensor = comm_time(moved["tensor"], tp, *_link(cluster, tp))
    link = _link(cluster, g if pp > 1 else 1)
    p2p = comm_time(moved["pipeline"], 2, cluster.get("p2p_bw", link[0]), cluster.get("p2p_alpha", link[1]))
    bubble = (pp - 1) / (m * chunks) * (compute + tensor + p2p)
    data_link = _link(cluster, tp * dp)
    data = comm_time(moved["data"], dp, *data_link)
    # What a backward can hide: the gradients' reduction (ZeRO-3: also the gathers FSDP2 prefetches),
    # not ZeRO-1/2's all-gather of the updated parameters, which follows the optimizer step; and a
    # reduction issued once per step (ZeRO-0/1: after gradient accumulation) overlaps only the last
    # micro-batch's backward, one issued per micro-batch (ZeRO-2/3) every micro-batch's.
    after_step = moved["data"]["kind"].get("all_gather", 0) if zero in (1, 2) else 0
    overlappable = data - (comm_time(_only(moved["data"], "all_gather"), dp, *data_link)
                           if after_step else 0.0)
    window = compute * backward_share(model, micro_batch, tp, pp, recompute) / (m if zero <= 1 else 1)
    hidden = min(overlap * overlappable, window)
    exposed = data - hidden
    total = compute + tensor + p2p + bubble + exposed
    return {"compute": compute, "tensor": tensor, "p2p": p2p, "bubble": bubble, "data": exposed,
            "hidden": hidden, "overlappable": overlappable, "total": total, "micro_batches": m,
            "traffic": moved}


# ---------------------------------------------------------------------------------- the plan

def evaluate(model, cluster, global_batch, micro_batch, dp, tp, pp, zero=0, recompute="full",
             sequence_parallel=True, overlap=0.0, chunks=1):
    """One configuration: memory, time, whether it fits (in memory less the reserve), and three rates per
    GPU: "executed" TFLOP/s (the FLOPs it runs, recomputation included: at most peak x efficiency),
    "mfu" (the model's FLOPs without recomputation over the peak) and "tflops", the paper's metric
    (Eq. 3 counts a recomputed forward: only for full recomputation is it a rate of work done).
    Raises ValueError with the reason when it cannot run at all."""
    why = check(model, cluster, global_batch, micro_batch, dp, tp, pp, chunks)
    if why:
        raise ValueError(why)
    sp = sequence_parallel and tp > 1
    mem = memory(model, cluster, global_batch, micro_batch, dp, tp, pp, zero, recompute, sp, chunks)
    t = step_time(model, cluster, global_batch, micro_batch, dp, tp, pp, zero, recompute, overlap, chunks, sp)
    g = dp * tp * pp
    return {"dp": dp, "tp": tp, "pp": pp, "zero": zero, "recompute": recompute, "micro_batch": micro_batch,
            "m": t["micro_batches"], "sp": sp, "chunks": chunks, "memory": mem, "time": t,
            "fits": mem["total"] <= cluster["memory"] * (1 - cluster.get("reserve", 0.0)),
            "tflops": paper_flops(model, global_batch) / (t["total"] * g) / 1e12,   # the paper's metric
            "executed": executed_flops(model, global_batch, recompute) / (t["total"] * g) / 1e12,
            "mfu": executed_flops(model, global_batch) / (t["total"] * g * cluster["peak_flops"])}


def plan(model, cluster, global_batch, micro_batches=(1, 2, 4, 8), zero_stages=(0, 1, 2, 3),
         recomputes=RECOMPUTE, sequence_parallel=True, overlap=0.0, chunks=1):
    """Every configuration that divides correctly and fits in memory, fastest first (ties: less
    memory, then the lower ZeRO stage and less recomputation)."""
    g = cluster["gpus_per_node"] * cluster["nodes"]
    out = []
    for dp, tp, pp in layouts(g, cluster["gpus_per_node"], model["heads"], model["layers"]):
        for b in micro_batches:
            if check(model, cluster, global_batch, b, dp, tp, pp, chunks):
                continue
            for zero in zero_stages:
                for rc in recomputes:
                    r = evaluate(model, cluster, global_batch, b, dp, tp, pp, zero, rc,
                                 sequence_parallel, overlap, chunks)
                    if r["fits"]:
                        out.append(r)
    out.sort(key=lambda r: (r["time"]["total"], r["memory"]["total"], r["zero"], RECOMPUTE.index(r["recompute"])))
    return out


def best_per_layout(ranked):
    """The fastest configuration of each (dp, tp, pp), in rank order."""
    seen, out = set(), []
    for r in ranked:
        if (r["dp"], r["tp"], r["pp"]) not in seen:
            seen.add((r["dp"], r["tp"], r["pp"]))
            out.append(r)
    return out


def describe(r):
    """One line: the configuration, its time broken down, its memory."""
    t, mem = r["time"], r["memory"]
    return (f"dp={r['dp']} tp={r['tp']} pp={r['pp']} zero={r['zero']} b={r['micro_batch']} m={r['m']} "
            f"{r['recompute']}{' +sp' if r['sp'] else ''}: {t['total']:.3f} s = compute {t['compute']:.3f}"
            f" + tp {t['tensor']:.3f} + p2p {t['p2p']:.3f} + bubble {t['bubble']:.3f} + dp {t['data']:.3f};"
            f" {mem['total'] / 1e9:.1f} GB; {r['executed']:.0f} TFLOP/s per GPU executed, MFU {r['mfu']:.0%}")




# this machine (helpers/planner_machine.py), through `planner.` as before
from helpers.planner_machine import (compare, machine_cluster, machine_figures, machine_rank,  # noqa: E402,F401
                                     p2p_link, ring_link, run_rank, tiny_model, tiny_step_time)
