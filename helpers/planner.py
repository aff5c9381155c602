"""A planner for N-D parallel training (lecture 13): memory per GPU and step time of every (dp, tp, pp)
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

Layouts follow Megatron-LM: tp innermost, then dp, then pp, so a tensor-parallel group is tp
consecutive GPUs of one node, a data-parallel group strides by tp, pipeline neighbours are tp*dp apart.
model:   layers, hidden, heads, vocab, seq, params (None: Narayanan et al. 2021's Eq. 2).
cluster: gpus_per_node, nodes, memory (bytes), reserve (fraction of memory kept free, default 0), peak_flops, efficiency, intra_bw / inter_bw (bytes/s
         per GPU per direction, lecture 00's convention; inter_bw is one GPU's own NIC), intra_alpha /
         inter_alpha (s). Sizes in bytes, times in seconds, FLOPs as counts.
"""
from helpers.cost import fit_alpha_beta, ring_all_gather, ring_all_reduce

RECOMPUTE = ("none", "selective", "full")
BF16 = 2                                    # bytes per 16-bit element (lecture 10, section 4)


# ------------------------------------------------------------------------------- FLOPs, params

def param_count(model):
    """P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)): Narayanan et al. 2021, Eq. 2."""
    if model.get("params"):
        return model["params"]
    l, h, V, s = model["layers"], model["hidden"], model["vocab"], model["seq"]
    return 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


def paper_flops(model, batch):
    """F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration, with full recomputation:
    Narayanan et al. 2021, Eq. 3, the FLOPs their teraFLOP/s figures divide by the time."""
    l, h, V, s = model["layers"], model["hidden"], model["vocab"], model["seq"]
    return 96 * batch * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def executed_flops(model, batch, recompute="none"):
    """FLOPs a step runs: 3 passes (forward, backward = 2 forwards) of 24 B s l h^2 (1 + s/(6h)) plus
    the logits' 6 B s h V; full recomputation adds a forward (then this is Eq. 3), selective only the
    attention core, 4 B s^2 h a layer (lecture 10, section 3)."""
    l, h, V, s = model["layers"], model["hidden"], model["vocab"], model["seq"]
    one_forward = 24 * batch * s * l * h * h * (1 + s / (6 * h))
    extra = {"none": 0.0, "selective": 4 * batch * s * s * h * l, "full": one_forward}[recompute]
    return 3 * one_forward + 6 * batch * s * h * V + extra


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

def stage_params(model, tp, pp):
    """Parameters on one GPU of the first stage: its L/p layers' share / t plus the word embedding
    V h / t (vocabulary-parallel over t), which Eq. 2's P spreads over every stage but stage 0 holds."""
    embed = model["vocab"] * model["hidden"]
    return (param_count(model) - embed) / (tp * pp) + embed / tp


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


def step_time(model, cluster, global_batch, micro_batch, dp, tp, pp, zero, recompute,
              overlap=0.0, chunks=1):
    """Seconds of one training step on every GPU, broken down."""
    s, h, L = model["seq"], model["hidden"], model["layers"]
    g = dp * tp * pp
    m = global_batch // (dp * micro_batch)
    compute = executed_flops(model, global_batch, recompute) / (g * cluster["peak_flops"] * cluster["efficiency"])
    act = BF16 * micro_batch * s * h                                         # one b s h activation
    # Megatron's f/g: 2 all-reduces forward, 2 backward per layer and micro-batch, 2 more in a
    # recomputed forward (lecture 07); sequence parallelism's reduce-scatter + all-gather: same bytes.
    bw, alpha = _link(cluster, tp)
    tensor = (L // pp) * m * (6 if recompute == "full" else 4) * ring_all_reduce(act, tp, bw, alpha)
    # 1F1B: one activation forward, one gradient back per micro-batch and chunk; with scatter/gather
    # each of the tp ranks sends 1/tp of it on its own NIC (Narayanan et al., section 4.1).
    bw, alpha = _link(cluster, g if pp > 1 else 1)
    p2p = 2 * m * chunks * (alpha + act / tp / bw) if pp > 1 else 0.0
    # m + p - 1 slots for m slots of work: the bubble is (p-1)/m of the work (lecture 08), over v chunks
    bubble = (pp - 1) / (m * chunks) * (compute + tensor + p2p)
    # data parallel: bf16 gradients of this GPU's weights (lecture 05); ZeRO's collectives (lecture 06)
    grad_bytes = BF16 * stage_params(model, tp, pp)                         # the fullest stage
    bw, alpha = _link(cluster, tp * dp)
    ar, ag = ring_all_reduce(grad_bytes, dp, bw, alpha), ring_all_gather(grad_bytes, dp, bw, alpha)
    if zero <= 1:                        # one all-reduce (ZeRO-1: reduce-scatter + all-gather, same bytes)
        data = ar
    elif zero == 2:                      # only a gradient shard is kept: reduce-scatter per micro-batch
        data = m * ag + ag
    else:                                # gather for forward, backward (and recompute), reduce-scatter
        data = m * (3 + (recompute == "full")) * ag
    data *= 1.0 - overlap                # the part not hidden behind the backward (lectures 04-05)
    total = compute + tensor + p2p + bubble + data
    return {"compute": compute, "tensor": tensor, "p2p": p2p, "bubble": bubble, "data": data,
            "total": total, "micro_batches": m}


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
    t = step_time(model, cluster, global_batch, micro_batch, dp, tp, pp, zero, recompute, overlap, chunks)
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


# ------------------------------------------- this machine: measured alpha, B, FLOP/s (lecture 03)

def ring_link(rows):
    """(alpha, B) of one ring step from nccl-tests-style all-reduce rows (helpers.bench.sweep): the
    fit t = a + b n inverted through the ring model t = 2(K-1)(alpha + n/(K B)) (lecture 02)."""
    k = rows[0]["world_size"]
    fit = fit_alpha_beta([r["size"] for r in rows], [r["time_us"] * 1e-6 for r in rows])
    return fit.alpha / (2 * (k - 1)), 2 * (k - 1) / k * fit.bandwidth   # inf when no size term shows


def p2p_link(rows):
    """(alpha, B) of one message from send_recv rows: t = alpha + n/B."""
    fit = fit_alpha_beta([r["size"] for r in rows], [r["time_us"] * 1e-6 for r in rows])
    return fit.alpha, fit.bandwidth


def tiny_model(cfg):
    """The planner's model dict of nd3d's tiny GPT (cfg: vocab, dim, heads, depth, seq, batch)."""
    return {"layers": cfg["depth"], "hidden": cfg["dim"], "heads": cfg["heads"], "vocab": cfg["vocab"],
            "seq": cfg["seq"], "params": None}


def machine_rank(rank, world_size, cfg, sizes, iters=5, dtype="float64"):
    """In every rank at once (inside helpers.spawn): the single-process tiny GPT's step (forward and
    backward) timed at the whole batch and its halvings down to batch/(2K), while the other ranks run
    it too (they share the cores and memory, as in a run); then all_reduce and send_recv swept as
    nccl-tests does (helpers.bench). Returns {batch: [seconds per call]} and the sweep."""
    import torch
    import torch.distributed as dist

    from helpers import bench, timing, tiny
    from helpers.spawn import device
    dev, dt = device(), getattr(torch, dtype)
    gpt = tiny.transformer(cfg["vocab"], cfg["dim"], cfg["heads"], cfg["depth"], dtype=dt, device=dev)
    ids, targets = tiny.tokens(cfg["batch"], cfg["seq"], cfg["vocab"], device=dev)
    steps, n = {}, cfg["batch"]
    while n >= max(1, cfg["batch"] // (2 * world_size)):
        def step(n=n):
            gpt.zero_grad()
            tiny.lm_loss(gpt(ids[:n]), targets[:n]).backward()
        dist.barrier()
        steps[n] = timing.measure(step, warmup=1, iters=iters, device=dev)
        n //= 2
    plan = [(kind, kind, None) for kind in ("all_reduce", "send_recv")]
    return {"step_s": steps, "sweep": bench.measure_rank(rank, world_size, plan, sizes, 2, iters, dtype, rounds=3)}


def machine_figures(per_rank, cfg, stat=None, dtype="float64"):
    """This machine as the small-model mode needs it, from machine_rank's per-rank results: compute
    t = c0 + F/R fitted to the steps' executed FLOPs F and times (the slowest rank's `stat` over its
    calls), the alpha-beta form of a link (lecture 03): R the FLOP/s per rank, c0 a pass's fixed cost
    (Python and the ops' dispatch, as a GPU's kernel launches); (alpha, B) of a ring step and of a
    message, fitted to each size's `stat` over the sweep's rounds. stat: statistics.median by default."""
    import statistics

    from helpers import bench
    stat = stat or statistics.median
    rows = bench.combine([r["sweep"] for r in per_rank], len(per_rank), dtype)
    rows = [dict(r, time_us=stat(r["times_us"])) for r in rows]
    batches = sorted(per_rank[0]["step_s"])
    seconds = [max(stat(r["step_s"][n]) for r in per_rank) for n in batches]
    compute = fit_alpha_beta([executed_flops(tiny_model(cfg), n) for n in batches], seconds)
    ar_alpha, ar_bw = ring_link([r for r in rows if r["kind"] == "all_reduce"])
    p2p_alpha, p2p_bw = p2p_link([r for r in rows if r["kind"] == "send_recv"])
    return {"ranks": len(per_rank), "flops": compute.bandwidth, "c0": compute.alpha, "ar_alpha": ar_alpha,
            "ar_bw": ar_bw, "p2p_alpha": p2p_alpha, "p2p_bw": p2p_bw, "element": 8 if dtype == "float64" else 4,
            "rows": rows, "steps": dict(zip(batches, seconds))}


# ---------------------------------------------------- small-model mode: nd3d.train's 3D step

def tiny_step_time(cfg, machine, dp, tp, pp, micro_batches, head_split=False):
    """Predicted seconds of one step of nd3d.train on this machine, broken down (same terms as
    step_time). Per micro-batch of b = batch/(dp m) samples the busiest stage spends c0/pp (its share
    of a pass's fixed cost) plus its FLOPs over R: its blocks' 72 b s h^2 (1 + s/6h) / tp and the
    logits' 6 b s h V on the last stage (/ tp if the head is split); it sends 4 all-reduces of b s h elements per block over tp (f/g, lecture 07) and one
    activation each way to its neighbour stage; the pipeline runs m + p - 1 such slots (lecture 08);
    then one ring all-reduce of the stage's gradients over dp (lecture 05)."""
    h, s, V, L, e = cfg["dim"], cfg["seq"], cfg["vocab"], cfg["depth"], machine["element"]
    m, b = micro_batches, cfg["batch"] // (dp * micro_batches)
    block = 72 * b * s * h * h * (1 + s / (6 * h))
    head = 6 * b * s * h * V / (tp if head_split else 1)
    flops = (L // pp) * block / tp + head                    # the last stage, the busiest
    act = e * b * s * h
    compute = machine.get("c0", 0.0) / pp + flops / machine["flops"]   # the stage's share of a pass's fixed cost
    tensor = (L // pp) * 4 * ring_all_reduce(act, tp, machine["ar_bw"], machine["ar_alpha"])
    p2p = 2 * (machine["p2p_alpha"] + act / machine["p2p_bw"]) if pp > 1 else 0.0
    slot = compute + tensor + p2p
    # gradients of the fullest stage: blocks (column/row-parallel weights / tp; norms and the row-
    # parallel biases whole), token and position embeddings on the first stage, norm and head on the last
    blocks = (L // pp) * ((12 * h * h + 7 * h) / tp + 6 * h)
    embed = (V + cfg.get("max_seq", 64)) * h
    head_params = (h * V + V) / (tp if head_split else 1) + 2 * h
    params = blocks + embed + head_params if pp == 1 else blocks + max(embed, head_params)
    data = ring_all_reduce(e * params, dp, machine["ar_bw"], machine["ar_alpha"])
    return {"compute": m * compute, "tensor": m * tensor, "p2p": m * p2p, "bubble": (pp - 1) * slot,
            "data": data, "total": (m + pp - 1) * slot + data, "micro_batches": m}


# --------------------------------------------- the check: predicted against measured, one launch

def run_rank(rank, world_size, train, cfg, configs, steps, micro_batches, rounds, sizes, iters=5):
    """In every rank (inside helpers.spawn): `rounds` rounds of this machine's figures (machine_rank)
    followed by train(rank, world_size, dp, tp, pp, cfg, steps, micro_batches, timed=True) for each
    configuration, so that a change of the machine's load falls on figures and runs alike."""
    out = {"machine": [], "runs": []}
    for _ in range(rounds):
        out["machine"].append(machine_rank(rank, world_size, cfg, sizes, iters))
        out["runs"].append({c: train(rank, world_size, *c, cfg, steps, micro_batches, timed=True) for c in configs})
    return out


def compare(per_rank, cfg, micro_batches, stat=None, warmup_steps=1):
    """From run_rank's results: this machine's figures (machine_figures over all rounds pooled), and per
    configuration the predicted and measured step (the slowest rank per step, `stat` over every step of
    every round after `warmup_steps`), the relative error and the prediction's terms; and the median
    |relative error| over the configurations. stat: statistics.median (the series' convention, the
    default) or min (the fastest: interference from other work only adds time)."""
    import statistics
    stat = stat or statistics.median
    n = len(per_rank[0]["machine"])
    pooled = [{"step_s": {b: [t for m in r["machine"] for t in m["step_s"][b]] for b in r["machine"][0]["step_s"]},
               "sweep": dict(r["machine"][0]["sweep"], rows=[
                   dict(row, times=[t for m in r["machine"] for t in m["sweep"]["rows"][i]["times"]])
                   for i, row in enumerate(r["machine"][0]["sweep"]["rows"])])} for r in per_rank]
    machine = machine_figures(pooled, cfg, stat)
    rows = []
    for c in per_rank[0]["runs"][0]:
        steps = [max(ts) for i in range(n)
                 for ts in list(zip(*(r["runs"][i][c]["step_s"] for r in per_rank)))[warmup_steps:]]
        measured, pred = stat(steps), tiny_step_time(cfg, machine, *c, micro_batches)
        rows.append({"dp,tp,pp": ",".join(map(str, c)), "predicted ms": 1e3 * pred["total"],
                     "measured ms": 1e3 * measured, "error": pred["total"] / measured - 1,
                     **{k: 1e3 * pred[k] for k in ("compute", "tensor", "p2p", "bubble", "data")}})
    return machine, rows, statistics.median(abs(r["error"]) for r in rows)
