"""This machine as the planner's cluster (lecture 14, section 4): compute alone, the slowdown of ranks
computing at once, alpha and B, and the wait of a call after compute, measured in the ranks
(machine_rank, after_compute, machine_figures), nd3d's tiny GPT as a planner model (tiny_model), its step
predicted by the planner's one model (tiny_step_time = planner.step_time on machine_cluster), and the
check of predicted against measured in one launch (run_rank, compare)."""
import statistics

from helpers.cost import fit_alpha_beta
from machinery.l14_planner.counts import executed_flops
from machinery.l14_planner.step import step_time

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


def tiny_model(cfg, head_split=False):
    """The planner's model dict of nd3d's tiny GPT (cfg: vocab, dim, heads, depth, seq, batch), its
    parameters placed as nd3d places them: per block the column- and row-parallel weights and the
    column-parallel biases split over tp (12 h^2 + 7 h), the norms and the row-parallel biases whole
    (6 h); token and position embeddings whole on the first stage; the head (h V + V, split if
    head_split) and the final norm (2 h) on the last; a pipeline send carries the whole activation."""
    h, V = cfg["dim"], cfg["vocab"]
    return {"layers": cfg["depth"], "hidden": h, "heads": cfg["heads"], "vocab": V, "seq": cfg["seq"],
            "params": None, "layer_split": 12 * h * h + 7 * h, "layer_whole": 6 * h,
            "embed": (V + cfg.get("max_seq", 64)) * h, "embed_split": False, "head": h * V + V,
            "head_split": head_split, "head_whole": 2 * h, "p2p_split": False}


def machine_cluster(machine):
    """This machine's figures (machine_figures) as a planner cluster: R FLOP/s of one rank alone at
    efficiency 1, the pass's fixed cost c0, the slowdown of n ranks computing at once, the ring step's
    alpha and B on every link (one "node"), the data-parallel call's wait after compute, the
    message's alpha and B for the pipeline's sends."""
    return {"gpus_per_node": machine.get("ranks", 1), "nodes": 1, "memory": float("inf"),
            "peak_flops": machine["flops"], "efficiency": 1.0, "c0": machine.get("c0", 0.0),
            **{key: machine[key] for key in ("slowdown", "data_wait") if key in machine},
            "intra_bw": machine["ar_bw"], "intra_alpha": machine["ar_alpha"],
            "inter_bw": machine["ar_bw"], "inter_alpha": machine["ar_alpha"],
            "p2p_bw": machine["p2p_bw"], "p2p_alpha": machine["p2p_alpha"]}


def machine_rank(rank, world_size, cfg, sizes, iters=5, dtype="float64", program=None):
    """In every rank (inside helpers.spawn): the model's forward and backward on one rank holding all
    of it, timed on rank 0 alone (the others asleep in a barrier) at the whole batch and its halvings
    down to batch/(2K); then the whole batch on n ranks at once, n = busy_counts(K), `iters` times
    back to back (they share the cores and memory); the data-parallel all-reduce after compute
    (after_compute); all_reduce and send_recv swept as nccl-tests does (helpers.bench). The forward
    and backward are the program's own (`program`: the name of the module of the measured train,
    e.g. "nd3d", whose stage_params and stage_forward run with every group of one rank, so no call
    is made), or the tiny GPT's when program is None. Returns {"step_s": {batch: [s]} (rank 0),
    "busy_s": {n: s per step, None on ranks >= n}, "after": ..., "sweep": ...}."""
    import importlib
    import time

    import torch
    import torch.distributed as dist

    from helpers import bench, timing, tiny
    from helpers.spawn import device
    dev, dt = device(), getattr(torch, dtype)
    ids, targets = tiny.tokens(cfg["batch"], cfg["seq"], cfg["vocab"], device=dev)
    if program is None:
        gpt = tiny.transformer(cfg["vocab"], cfg["dim"], cfg["heads"], cfg["depth"], dtype=dt, device=dev)
        params, forward = list(gpt.parameters()), gpt
    else:
        prog = importlib.import_module(program)
        P, _ = prog.stage_params(cfg, 0, 1, 0, 1, dev, dt)
        alone = {"size": {"pp": 1, "dp": 1, "tp": 1}}
        params, forward = list(P.values()), (lambda x: prog.stage_forward(P, x, cfg, alone))
    def step(n):
        tiny.lm_loss(forward(ids[:n]), targets[:n]).backward()
        for p in params:
            p.grad = None
    steps, n = {}, cfg["batch"]   # rank 0 alone (the others wait, asleep, in the barrier)
    dist.barrier()
    while rank == 0 and n >= max(1, cfg["batch"] // (2 * world_size)):
        steps[n] = timing.measure(lambda: step(n), warmup=1, iters=iters, device=dev)
        n //= 2
    step(cfg["batch"])   # then n ranks at once, n = 1, 2, 4, ..., K: the whole batch `iters` times
    busy = {}
    for n in busy_counts(world_size):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters if rank < n else 0):
            step(cfg["batch"])
        timing.sync(dev)
        busy[n] = (time.perf_counter() - t0) / iters if rank < n else None
    plan = [(kind, kind, None) for kind in ("all_reduce", "send_recv")]
    share = max(1, cfg["batch"] // world_size)   # any layout's compute per rank: the batch over K
    return {"step_s": steps, "busy_s": busy, "after": after_compute(rank, world_size, step, share, dt, dev),
            "sweep": bench.measure_rank(rank, world_size, plan, sizes, 2, iters, dtype, rounds=3)}


def busy_counts(k):
    """1, 2, 4, ... up to k, and k: the numbers of ranks computing at once that machine_rank times."""
    return sorted({2 ** i for i in range(k.bit_length()) if 2 ** i <= k} | {k})


AFTER_SIZES = (2 ** 16, 2 ** 21)   # bytes: the data-parallel gradients of section 4's layouts lie between


def after_compute(rank, world_size, step, batch, dtype, dev, sizes=AFTER_SIZES, reps=4):
    """In every rank: the data-parallel all-reduce as a training step issues it, after every rank's
    forward and backward: for each group size g (dividing world_size, > 1; groups of g consecutive
    ranks, all at once) and size, `reps` times step(batch) then the call, its start and end on
    time.perf_counter (one monotonic clock for every process of the machine).
    Returns {(g, size): [(start, end)] per rep}."""
    import time

    import torch
    import torch.distributed as dist

    from helpers.timing import sync
    out = {}
    for g in [g for g in range(2, world_size + 1) if world_size % g == 0]:
        group = [dist.new_group(list(range(i, i + g))) for i in range(0, world_size, g)][rank // g]
        for n in sizes:
            x = torch.ones(n // dtype.itemsize, dtype=dtype, device=dev)
            dist.all_reduce(x, group=group)   # untimed: the group's first call sets it up
            out[g, n] = []
            for _ in range(reps):
                step(batch)
                sync(dev)
                t0 = time.perf_counter()
                dist.all_reduce(x, group=group)
                sync(dev)                  # on a GPU the call returns before the stream has run it
                out[g, n].append((t0, time.perf_counter()))
    return out


def after_waits(per_rank, ring, stat):
    """{g: seconds} from after_compute's stamps: per call the time from the last rank's start to the
    last end (the step waits for its slowest rank) less the ring's back-to-back time for that size and
    group, ring = (alpha, B) of ring_link; `stat` over every call of every size, at least 0."""
    from helpers.cost import ring_all_reduce
    waits = {}
    for g, n in per_rank[0]["after"]:
        calls = zip(*(r["after"][g, n] for r in per_rank))
        waits.setdefault(g, []).extend(max(e for _, e in c) - max(s for s, _ in c)
                                       - ring_all_reduce(n, g, ring[1], ring[0]) for c in calls)
    return {g: max(0.0, stat(w)) for g, w in waits.items()}


def machine_figures(per_rank, cfg, stat=None, dtype="float64"):
    """This machine as the small-model mode needs it, from machine_rank's per-rank results: compute
    t = c0 + F/R fitted to rank 0's steps alone (`stat` over its calls) against their executed FLOPs
    F, the alpha-beta form of a link (lecture 03): R the FLOP/s of one rank alone, c0 a pass's fixed
    cost (Python and the ops' dispatch, as a GPU's kernel launches); the slowdown {n: the slowest
    of n ranks computing at once against one alone}; (alpha, B) of a ring step and of a message,
    fitted to each size's `stat` over the sweep's rounds; the data-parallel call's wait after
    compute per group size (after_waits). stat: statistics.median by default."""
    from helpers import bench
    stat = stat or statistics.median
    rows = bench.combine([r["sweep"] for r in per_rank], len(per_rank), dtype)
    rows = [dict(r, time_us=stat(r["times_us"])) for r in rows]
    batches = sorted(per_rank[0]["step_s"])
    seconds = [stat(per_rank[0]["step_s"][n]) for n in batches]          # rank 0 alone
    compute = fit_alpha_beta([executed_flops(tiny_model(cfg), n) for n in batches], seconds)
    busy = {n: max(stat(r["busy_s"][n]) for r in per_rank[:n]) for n in per_rank[0]["busy_s"]}
    slowdown = {n: max(1.0, t / busy[1]) for n, t in busy.items()}   # n at once against one alone
    ar_alpha, ar_bw = ring_link([r for r in rows if r["kind"] == "all_reduce"])
    p2p_alpha, p2p_bw = p2p_link([r for r in rows if r["kind"] == "send_recv"])
    after = {"data_wait": after_waits(per_rank, (ar_alpha, ar_bw), stat)} if per_rank[0].get("after") else {}
    return {**after, "ranks": len(per_rank), "slowdown": slowdown, "flops": compute.bandwidth,
            "c0": compute.alpha, "ar_alpha": ar_alpha, "ar_bw": ar_bw, "p2p_alpha": p2p_alpha,
            "p2p_bw": p2p_bw, "element": 8 if dtype == "float64" else 4, "rows": rows, "steps": dict(zip(batches, seconds))}


# ---------------------------------------------------- small-model mode: nd3d.train's 3D step

def tiny_step_time(cfg, machine, dp, tp, pp, micro_batches, head_split=False):
    """Predicted seconds of one step of nd3d.train on this machine, broken down: planner.step_time
    itself, on tiny_model(cfg) and machine_cluster(machine), in the machine's element (float64: 8
    bytes), without recomputation or ZeRO. So per micro-batch of b = batch/(dp m) samples the busiest
    (last) stage spends c0/pp plus its FLOPs over R, 4 all-reduces of b s h elements per block over tp
    (f/g, lecture 07) and one activation each way to its neighbour; m + p - 1 such slots (lecture
    08); then one ring all-reduce of the fullest stage's gradients over dp (lecture 05)."""
    b = cfg["batch"] // (dp * micro_batches)
    return step_time(tiny_model(cfg, head_split), machine_cluster(machine), cfg["batch"], b, dp, tp, pp,
                     zero=0, recompute="none", element=machine["element"])


# --------------------------------------------- the check: predicted against measured, one launch

def run_rank(rank, world_size, train, cfg, configs, steps, micro_batches, rounds, sizes, iters=5):
    """In every rank (inside helpers.spawn): `rounds` rounds of this machine's figures (machine_rank)
    followed by train(rank, world_size, dp, tp, pp, cfg, steps, micro_batches, timed=True) for each
    configuration, so that a change of the machine's load falls on figures and runs alike."""
    out = {"machine": [], "runs": []}
    for _ in range(rounds):
        out["machine"].append(machine_rank(rank, world_size, cfg, sizes, iters, program=train.__module__))
        out["runs"].append({c: train(rank, world_size, *c, cfg, steps, micro_batches, timed=True) for c in configs})
    return out


def compare(per_rank, cfg, micro_batches, stat=None, warmup_steps=1):
    """From run_rank's results: this machine's figures (machine_figures over all rounds pooled), and per
    configuration the predicted and measured step (per round the slowest rank's mean step after
    `warmup_steps`, the steps run back to back; `stat` over the rounds), the relative error and the
    prediction's terms; and the median
    |relative error| over the configurations. stat: statistics.median (the series' convention, the
    default) or min (the fastest: interference from other work only adds time)."""
    stat = stat or statistics.median
    n = len(per_rank[0]["machine"])
    pooled = [{"step_s": {b: [t for m in r["machine"] for t in m["step_s"][b]] for b in r["machine"][0]["step_s"]},
               "busy_s": {n: [m["busy_s"][n] for m in r["machine"]] for n in r["machine"][0]["busy_s"]},
               "after": {key: [c for m in r["machine"] for c in m["after"][key]] for key in r["machine"][0]["after"]},
               "sweep": dict(r["machine"][0]["sweep"], rows=[
                   dict(row, times=[t for m in r["machine"] for t in m["sweep"]["rows"][i]["times"]])
                   for i, row in enumerate(r["machine"][0]["sweep"]["rows"])])} for r in per_rank]
    machine = machine_figures(pooled, cfg, stat)
    rows = []
    for c in per_rank[0]["runs"][0]:
        steps = [max(statistics.fmean(r["runs"][i][c]["step_s"][warmup_steps:]) for r in per_rank)
                 for i in range(n)]   # per round: the slowest rank's mean step, steps back to back
        measured, pred = stat(steps), tiny_step_time(cfg, machine, *c, micro_batches)
        rows.append({"dp,tp,pp": ",".join(map(str, c)), "predicted ms": 1e3 * pred["total"],
                     "measured ms": 1e3 * measured, "error": pred["total"] / measured - 1,
                     **{k: 1e3 * pred[k] for k in ("compute", "sharing", "tensor", "p2p", "bubble", "data")}})
    return machine, rows, statistics.median(abs(r["error"]) for r in rows)


def old_price(machine):
    """The machine's figures as the check priced them before it modelled the shared cores: every
    slot's compute at the speed of all K ranks busy, no wait after compute (a control)."""
    k = machine["ranks"]
    return dict(machine, slowdown={1: machine["slowdown"][k], k: machine["slowdown"][k]}, data_wait={})


def rescore(rows, machines, cfg, micro_batches):
    """The median |predicted / measured - 1| of summary()'s rows predicted on other figures
    ({K: machine}): the same measured steps, another price."""
    return statistics.median(
        abs(tiny_step_time(cfg, machines[r["K"]], *map(int, r["dp,tp,pp"].split(",")),
                           micro_batches)["total"] * 1e3 / r["measured ms"] - 1) for r in rows)


# ------------------------------------- the lecture's and the bench's check: one way to measure

def configurations(k, cfg, micro_batches):
    """Every (dp, tp, pp) with dp*tp*pp = k that nd3d's tiny GPT splits into: tp dividing the heads,
    pp the depth, and every data-parallel rank getting whole micro-batches."""
    return [(k // (tp * pp), tp, pp) for tp in range(1, k + 1) for pp in range(1, k + 1)
            if k % (tp * pp) == 0 and cfg["heads"] % tp == 0 and cfg["depth"] % pp == 0
            and cfg["batch"] % (k // (tp * pp) * micro_batches) == 0]


def measure(train, check, cfg, worlds, micro_batches, steps, rounds, sizes, backend="auto",
            timeout=600):
    """For each rank count k of `worlds`: one launch of k ranks running run_rank over every
    configuration of k ranks (this machine's figures with k ranks busy at once, then the runs, in
    `rounds` rounds); every run of every round checked against the single process afterwards
    (check(results, cfg, steps), on one thread as each rank runs). Returns {k: per-rank results}."""
    import torch

    from helpers.spawn import spawn
    out = {}
    for k in worlds:
        configs = configurations(k, cfg, micro_batches)
        out[k] = spawn(run_rank, k, args=(train, cfg, configs, steps, micro_batches, rounds, sizes),
                       backend=backend, timeout=timeout)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            for i in range(rounds):
                for c in configs:
                    check([r["runs"][i][c] for r in out[k]], cfg, steps)
        finally:
            torch.set_num_threads(threads)
    return out


def summary(measured, cfg, micro_batches, stat=None):
    """From measure()'s results: this machine's figures per rank count ({k: figures}), the rows of
    every layout of every k (compare's rows, with "K"), the median |relative error| over all of them,
    and the same median for each round alone (its own figures, its own runs): the spread of the
    check over repeated runs."""
    machines, rows, per_round = {}, [], []
    for k, per_rank in measured.items():
        machines[k], k_rows, _ = compare(per_rank, cfg, micro_batches, stat)
        rows += [{"K": k, **r} for r in k_rows]
    for i in range(len(next(iter(measured.values()))[0]["runs"])):
        errors = []
        for per_rank in measured.values():
            one = [{"machine": r["machine"][i:i + 1], "runs": r["runs"][i:i + 1]} for r in per_rank]
            errors += [abs(r["error"]) for r in compare(one, cfg, micro_batches, stat)[1]]
        per_round.append(statistics.median(errors))
    return machines, rows, statistics.median(abs(r["error"]) for r in rows), per_round
