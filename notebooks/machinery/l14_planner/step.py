"""The planner's time: the layouts of a cluster, the reason one cannot run (check), the step time of
one (step_time: compute, tensor, context, expert, pipeline, bubble and data time, the hidden part capped
by the compute it overlaps), and the plan over every layout that fits (evaluate, plan, describe). The
dictionaries and units are in the package's docstring (machinery/l14_planner/__init__.py)."""
from machinery.l14_planner.counts import (BF16, comm_time, executed_flops, paper_flops, stage_flops,
                                          stage_layers, stage_splits, traffic)
from machinery.l14_planner.memory import memory

RECOMPUTE = ("none", "selective", "full")


# ---------------------------------------------------------------------------------- layouts

def layouts(gpus, gpus_per_node, heads, layers, uneven=False):
    """Every (dp, tp, pp) with dp*tp*pp = gpus, tp dividing the node and the heads (lecture 07: whole
    heads per rank; tensor parallelism stays on NVLink) and pp dividing the layers (lecture 08), or,
    `uneven`, any pp with a split of the layers whose first and last stages hold fewer (stage_splits)."""
    out = []
    for tp in range(1, gpus_per_node + 1):
        if gpus_per_node % tp or heads % tp or gpus % tp:
            continue
        for pp in range(1, layers + 1):
            if (gpus // tp) % pp == 0 and (layers % pp == 0 or uneven and stage_splits(layers, pp)):
                out.append((gpus // (tp * pp), tp, pp))
    return out


def check(model, cluster, global_batch, micro_batch, dp, tp, pp, chunks=1, cp=1, ep=1, stages=None):
    """The reason a configuration cannot run, or None."""
    g, L = cluster["gpus_per_node"] * cluster["nodes"], model["layers"]
    if dp * tp * pp * cp != g:
        return f"dp*tp*pp*cp = {dp * tp * pp * cp}, not the {g} GPUs"
    if tp > cluster["gpus_per_node"] or cluster["gpus_per_node"] % tp:
        return f"tp={tp} would leave the node of {cluster['gpus_per_node']} GPUs"
    if model["heads"] % tp:
        return f"tp={tp} does not divide the {model['heads']} heads"
    if stages is None and L % (pp * chunks):
        return f"pp*chunks={pp * chunks} does not divide the {L} layers"
    if stages is not None and (len(stages) != pp or sum(stages) != L or min(stages) < 1):
        return f"stages {tuple(stages)}: pp={pp} counts of at least 1 layer, summing to {L}"
    if chunks > 1 and pp == 1:
        return "interleaved chunks need a pipeline (pp > 1)"
    if stages is not None and chunks > 1 and len(set(stages)) > 1:
        return "interleaved chunks need equal stages here"
    if cp > 1 and model["seq"] % (2 * cp):
        return f"cp={cp}: the sequence {model['seq']} must split in 2 cp chunks (lecture 11)"
    experts = model.get("experts", 0)
    if ep > 1 and (not experts or experts % ep or (dp * cp) % ep):
        return f"ep={ep} must divide the experts ({experts}) and dp*cp = {dp * cp}"
    if global_batch % (dp * micro_batch):
        return f"dp*micro_batch={dp * micro_batch} does not divide the batch {global_batch}"
    if chunks > 1 and (global_batch // (dp * micro_batch)) % pp:
        return "the interleaved schedule needs m to be a multiple of pp (paper, section 2.2.2)"
    return None


# -------------------------------------------------------------------------------------- time

def _link(cluster, span):
    """(bandwidth, alpha) of a group spanning `span` consecutive ranks: NVLink inside a node, the
    network across (lecture 00's hierarchy)."""
    if span <= cluster["gpus_per_node"]:
        return cluster["intra_bw"], cluster["intra_alpha"]
    return cluster["inter_bw"], cluster["inter_alpha"]


def _only(dim, kinds):
    """The calls of some kinds of a traffic() entry, as an entry comm_time prices."""
    return {"kind": {k: c for k, c in dim["kind"].items() if k in kinds},
            "kind_bytes": {k: b for k, b in dim["kind_bytes"].items() if k in kinds}}


def backward_share(model, micro_batch, tp, pp, recompute):
    """The share of a stage's compute that runs after its forward (the backward and, with
    recomputation, the recomputed forward in it): 2/3 without recomputation, 3/4 with a full one."""
    forward = stage_flops(model, micro_batch, tp, pp, "none") / 3
    return 1 - forward / stage_flops(model, micro_batch, tp, pp, recompute)


def _slot(cluster, moved, m, g, tp, pp, cp, ep, flops):
    """One stage's m micro-batches, by term: compute, then its tensor, context, expert, pipeline calls."""
    rate = cluster["peak_flops"] * cluster["efficiency"]
    link = _link(cluster, g if pp > 1 else 1)
    return {"compute": m * flops / rate,
            "tensor": comm_time(moved["tensor"], tp, *_link(cluster, tp)),
            "context": comm_time(moved["context"], cp, *_link(cluster, tp * cp)),
            "expert": comm_time(moved["expert"], ep, *_link(cluster, tp * cp * ep)),
            "p2p": comm_time(moved["pipeline"], 2, cluster.get("p2p_bw", link[0]),
                             cluster.get("p2p_alpha", link[1]))}


def step_time(model, cluster, global_batch, micro_batch, dp, tp, pp, zero, recompute,
              overlap=0.0, chunks=1, sequence_parallel=False, element=BF16, cp=1, ep=1, stages=None,
              main_grads=False):
    """Seconds of one training step on every GPU, broken down. Per micro-batch each stage computes
    for its stage_flops / (peak x efficiency); every collective of traffic() costs the ring formula of its S
    on the link its group spans (the pipeline's sends on p2p_bw / p2p_alpha when the cluster has
    them); the busiest stage's m micro-batches (its compute + tensor + context + expert + sends) set
    the pace, and the fill and the drain add each other stage's work of one micro-batch, / v
    (lecture 08; with equal stages (p - 1)/(m v) of the busiest one's, a bubble of p - 1 slots);
    with p > 1, ZeRO-2/3's per-micro-batch data calls sit in every slot, so the bubble grows by
    (p - 1)/(m v) of them. The
    data-parallel traffic (the fullest stage's) comes last, and `overlap` of what a backward can hide
    ("overlappable": all of it but ZeRO-1/2's parameter all-gather) is hidden, at most the backward
    compute it runs beside (backward_share; ZeRO-0/1's once-per-step reduction: the last
    micro-batch's): the rest is exposed."""
    m = global_batch // (dp * micro_batch)
    opts = dict(chunks=chunks, element=element, sequence_parallel=sequence_parallel, cp=cp, ep=ep,
                stages=stages, main_grads=main_grads)
    split = stage_layers(model, pp, stages)
    kinds = [(n, i == 0, i == pp - 1) for i, n in enumerate(split)]
    slots = {}                                               # one stage of each kind: first, middle, last
    for i, key in enumerate(kinds):
        if key not in slots:
            moved = traffic(model, global_batch, micro_batch, dp, tp, pp, zero, recompute, stage=i, **opts)
            flops = stage_flops(model, micro_batch, tp, pp, recompute, key[0], key[2], cp)
            slots[key] = (i, _slot(cluster, moved, m, dp * tp * pp * cp, tp, pp, cp, ep, flops))
    work = {key: sum(s.values()) for key, (_, s) in slots.items()}   # a stage's m micro-batches
    key = max(slots, key=lambda k: (work[k], slots[k][0]))
    (busiest, slot), busiest_work = slots[key], work[key]
    moved = traffic(model, global_batch, micro_batch, dp, tp, pp, zero, recompute, **opts)
    data_link = _link(cluster, tp * cp * dp)
    groups = (("data", dp * cp), ("expert_data", dp * cp // ep))

    def data_time(calls=("all_reduce", "all_gather", "reduce_scatter")):
        return sum(comm_time(_only(moved[d], calls), k, *data_link) for d, k in groups)
    data = data_time()
    # What a backward can hide: the gradients' reduction (ZeRO-3: also the gathers FSDP2 prefetches),
    # not ZeRO-1/2's all-gather of the updated parameters, which follows the optimizer step; and a
    # reduction issued once per step (ZeRO-0/1: after gradient accumulation) overlaps only the last
    # micro-batch's backward, one issued per micro-batch (ZeRO-2/3) every micro-batch's.
    overlappable = data - (data_time(("all_gather",)) if zero in (1, 2) else 0.0)
    window = slot["compute"] * backward_share(model, micro_batch, tp, pp, recompute) / (m if zero <= 1 else 1)
    hidden = min(overlap * overlappable, window)
    exposed = data - hidden
    per_micro_batch = {2: data_time(("reduce_scatter",)), 3: data}.get(zero, 0.0) if pp > 1 else 0.0
    in_slots = exposed * per_micro_batch / data if per_micro_batch else 0.0
    # The fill and the drain pass once through every other stage (a flow shop of p stages: the m v
    # chunks take sum_i t_i + (m v - 1) max_i t_i): equal stages give (p - 1)/(m v) of the slot.
    # Exact for 1F1B when the busiest stage is the last; an upper bound when it is earlier (its
    # warm-up forwards run while the first micro-batch travels down the pipeline and back).
    others = sum(work[k] for k in kinds) - busiest_work
    bubble = (others + (pp - 1) * in_slots) / (m * chunks)
    total = busiest_work + bubble + exposed
    return {**slot, "bubble": bubble, "data": exposed, "hidden": hidden,
            "overlappable": overlappable, "total": total, "micro_batches": m, "stage": busiest, "traffic": moved}


# ---------------------------------------------------------------------------------- the plan

def evaluate(model, cluster, global_batch, micro_batch, dp, tp, pp, zero=0, recompute="full",
             sequence_parallel=True, overlap=0.0, chunks=1, cp=1, ep=1, stages=None, main_grads=False):
    """One configuration: memory, time, whether it fits (in memory less the reserve), and three rates per
    GPU: "executed" TFLOP/s (the FLOPs it runs, recomputation included: at most peak x efficiency),
    "mfu" (the model's FLOPs without recomputation over the peak) and "tflops", the paper's metric
    (Eq. 3 counts a recomputed forward: only for full recomputation is it a rate of work done).
    Raises ValueError with the reason when it cannot run at all."""
    why = check(model, cluster, global_batch, micro_batch, dp, tp, pp, chunks, cp, ep, stages)
    if why:
        raise ValueError(why)
    sp = sequence_parallel and tp > 1
    more = dict(cp=cp, ep=ep, stages=stages, main_grads=main_grads)
    mem = memory(model, cluster, global_batch, micro_batch, dp, tp, pp, zero, recompute, sp, chunks, **more)
    t = step_time(model, cluster, global_batch, micro_batch, dp, tp, pp, zero, recompute, overlap, chunks, sp,
                  **more)
    g = dp * tp * pp * cp
    return {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "zero": zero, "recompute": recompute,
            "micro_batch": micro_batch, "m": t["micro_batches"], "sp": sp, "chunks": chunks,
            "stages": stage_layers(model, pp, stages), "memory": mem, "time": t,
            "fits": mem["total"] <= cluster["memory"] * (1 - cluster.get("reserve", 0.0)),
            "tflops": paper_flops(model, global_batch) / (t["total"] * g) / 1e12,   # the paper's metric
            "executed": executed_flops(model, global_batch, recompute) / (t["total"] * g) / 1e12,
            "mfu": executed_flops(model, global_batch) / (t["total"] * g * cluster["peak_flops"])}


def plan(model, cluster, global_batch, micro_batches=(1, 2, 4, 8), zero_stages=(0, 1, 2, 3),
         recomputes=RECOMPUTE, sequence_parallel=True, overlap=0.0, chunks=1, cps=(1,), eps=(1,),
         uneven=False, main_grads=False):
    """Every configuration that divides correctly and fits in memory, fastest first (ties: less
    memory, then the lower ZeRO stage and less recomputation). chunks: v, or the v's to try
    (interleaved 1F1B); cps, eps: the context- and expert-parallel sizes to try; uneven: also the
    splits whose first and last stages hold fewer layers (stage_splits)."""
    g = cluster["gpus_per_node"] * cluster["nodes"]
    usable, out = cluster["memory"] * (1 - cluster.get("reserve", 0.0)), []
    for cp in (c for c in cps if g % c == 0):
        for dp, tp, pp in layouts(g // cp, cluster["gpus_per_node"], model["heads"], model["layers"], uneven):
            splits = stage_splits(model["layers"], pp) if uneven else [None]
            for b, v, ep, split in ((b, v, ep, s) for b in micro_batches for v in _tuple(chunks)
                                    for ep in eps for s in splits):
                split = None if split is None or len(set(split)) == 1 else split
                if check(model, cluster, global_batch, b, dp, tp, pp, v, cp, ep, split):
                    continue
                sp = sequence_parallel and tp > 1
                for zero in zero_stages:
                    for rc in recomputes:
                        mem = memory(model, cluster, global_batch, b, dp, tp, pp, zero, rc, sp, v, cp,
                                     ep, split, main_grads)         # what does not fit is not timed
                        if mem["total"] > usable:
                            continue
                        out.append(evaluate(model, cluster, global_batch, b, dp, tp, pp, zero, rc,
                                            sequence_parallel, overlap, v, cp, ep, split, main_grads))
    out.sort(key=lambda r: (r["time"]["total"], r["memory"]["total"], r["zero"], RECOMPUTE.index(r["recompute"])))
    return out


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def best_per_layout(ranked):
    """The fastest configuration of each (dp, tp, pp, cp), in rank order."""
    seen, out = set(), []
    for r in ranked:
        key = (r["dp"], r["tp"], r["pp"], r.get("cp", 1))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def split_label(stages):
    """'7+14x8+7' for (7, 8, ..., 8, 7); '12x8' for equal stages."""
    first, *middle, last = stages if len(stages) > 1 else (stages[0], stages[0])
    if len(set(stages)) == 1:
        return f"{stages[0]}x{len(stages)}"
    return "+".join([str(first)] + ([f"{len(middle)}x{middle[0]}"] if middle else []) + [str(last)])


def describe(r):
    """One line: the configuration, its time broken down, its memory."""
    t, mem = r["time"], r["memory"]
    extra = "".join(f" {k}={r[k]}" for k in ("cp", "ep", "chunks") if r.get(k, 1) > 1)
    extra += f" stages {split_label(r['stages'])}" if len(set(r.get("stages", (1,)))) > 1 else ""
    comm = "".join(f" + {k} {t[k]:.3f}" for k in ("context", "expert") if t.get(k))
    return (f"dp={r['dp']} tp={r['tp']} pp={r['pp']}{extra} zero={r['zero']} b={r['micro_batch']} m={r['m']} "
            f"{r['recompute']}{' +sp' if r['sp'] else ''}: {t['total']:.3f} s = compute {t['compute']:.3f}"
            f" + tp {t['tensor']:.3f}{comm} + p2p {t['p2p']:.3f} + bubble {t['bubble']:.3f} + dp {t['data']:.3f};"
            f" {mem['total'] / 1e9:.1f} GB; {r['executed']:.0f} TFLOP/s per GPU executed, MFU {r['mfu']:.0%}")

