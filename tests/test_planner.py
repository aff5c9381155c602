"""Tests of lecture 14's planner, notebooks/machinery/l14_planner/ (step, counts, modelled, paper): memory,
traffic and time computed by hand, the overlap cap, the efficiency fitted and the baselines, feasibility rules,
ranking, nd3d's tiny GPT as a planner model (FLOPs counted by torch, gradients counted by tensor, the
prediction of section 4 on the H100 model), the paper's table against itself, and the layouts production runs make
(unequal stages, interleaving, context and expert parallelism, logits and fp32 main gradients in
memory, ZeRO-2/3 with a pipeline, the last stage's copy of a tied embedding, each stage's interleaved
warm-up, MoE all-to-alls of each tensor-parallel rank's tokens), each by hand with a negative control;
Table 1's rows as Megatron-LM's script ran them (micro-batch, interleaving). Fast: no process group."""
import math

import pytest
import torch

from helpers import cost, tiny
from machinery.l14_planner import paper
from machinery import l14_planner as planner

# A toy model and cluster whose numbers can be followed by hand.
TOY = {"layers": 4, "hidden": 8, "heads": 2, "vocab": 16, "seq": 4, "params": 1000}
CLUSTER = {"gpus_per_node": 4, "nodes": 2, "memory": 1e9, "peak_flops": 1000.0, "efficiency": 0.5,
           "intra_bw": 100.0, "intra_alpha": 0.5, "inter_bw": 10.0, "inter_alpha": 1.0}


def test_memory_by_hand():
    # dp=2 tp=2 pp=2, ZeRO-1, no recomputation, sequence parallel, b=1, batch 4 -> m = 2.
    mem = planner.memory(TOY, CLUSTER, 4, 1, 2, 2, 2, zero=1, recompute="none", sequence_parallel=True)
    local = (1000 - 128) / 4 + 128 / 2                 # layers / (tp pp) + word embedding V h / tp = 282
    assert planner.stage_params(TOY, 2, 2) == local and planner.stage_params(TOY, 2, 1) == 1000 / 2
    assert mem["params"] == 2 * local                  # bf16, not sharded below ZeRO-3
    assert mem["grads"] == 2 * local                   # not sharded below ZeRO-2
    assert mem["optim"] == 12 * local / 2              # ZeRO-1 shards the 12 bytes over dp = 2
    per_layer = 4 * 1 * 8 * (34 + 5 * 2 * 4 / 8) / 2   # s b h (34 + 5as/h) / t = 624
    assert mem["activations"] == 2 * per_layer * 2     # L/pp = 2 layers, min(pp, m) = 2 in flight
    assert mem["working"] == 0
    assert mem["total"] == 564 + 564 + 1692 + 2496


def test_memory_zero3_full_recompute_and_no_sp():
    mem = planner.memory(TOY, CLUSTER, 8, 1, 2, 2, 2, zero=3, recompute="full", sequence_parallel=False)
    assert (mem["params"], mem["grads"], mem["optim"]) == (282, 282, 1692)   # everything / dp
    # full recomputation keeps 2 s b h per layer, not divided by t without sequence parallelism;
    # m = 8 / 2 = 4 micro-batches, stage 0 holds min(pp=2, 4) = 2, the last 1 and the logits,
    # 6 s b V / t = 192, and with p > 1 the same parameters (its copy of the tied embedding):
    # the last is the fullest here
    assert mem["stage"] == 1 and mem["activations"] == 2 * (2 * 4 * 8) * 1 and mem["logits"] == 192
    assert mem["stages"][0] == mem["total"] - 192 + 2 * (2 * 4 * 8)
    # working: one layer rematerialised, s b h (10 + (24 + 5as/h)/t), and ZeRO-3's gathered layer
    assert mem["working"] == 4 * 8 * (10 + (24 + 5) / 2) + 2 * 2 * 2 * 12 * 64 / 2


def test_recomputation_working_memory_is_what_one_layer_rematerialises():
    # full: the whole layer, s b h (34 + 5as/h) / t; selective: only the attention core s b h 5as/h / t,
    # the 34 s b h / t of the layer is kept anyway (counting it again was the bug)
    sbh = 4 * 1 * 8
    f = lambda rc: planner.memory(TOY, CLUSTER, 8, 1, 4, 2, 1, 0, rc)["working"]   # noqa: E731
    assert f("none") == 0
    assert f("full") == sbh * (34 + 5) / 2
    assert f("selective") == sbh * 5 / 2


def test_activation_formulas():
    sbh = 4 * 1 * 8
    f = planner.activation_bytes_per_layer
    assert f(TOY, 1, 1, "none", True) == sbh * 39       # 34 + 5as/h = 34 + 5
    assert f(TOY, 1, 1, "selective", False) == sbh * 34  # tp = 1: with or without sp the same
    assert f(TOY, 1, 2, "selective", True) == sbh * 17
    assert f(TOY, 1, 2, "selective", False) == sbh * 22  # 10 + 24/2
    assert f(TOY, 2, 2, "full", True) == 2 * 2 * sbh / 2


def test_step_time_by_hand():
    t = planner.step_time(TOY, CLUSTER, 4, 1, 2, 2, 2, zero=1, recompute="none")
    one_forward = 24 * 1 * 4 * 4 * 64 * (1 + 4 / 48)     # 24 b s l h^2 (1 + s/6h), b = 1: 26624
    per_layer, head = 3 * one_forward / 4, 6 * 1 * 4 * 8 * 16      # 19968 a layer; logits 6 b s h V
    stage = 2 * per_layer / 2 + head / 2                  # the last stage: L/p = 2 layers / tp + head / tp
    assert planner.stage_flops(TOY, 1, 2, 2) == stage == 21504
    assert t["compute"] == pytest.approx(2 * stage / (1000 * 0.5))          # m = 2: 86.016
    ar_tp = 2 * 1 * (0.5 + 64 / (2 * 100))                # ring all-reduce of 2bsh = 64 B on 2 ranks
    assert t["tensor"] == pytest.approx(2 * 2 * 4 * ar_tp)                  # L/pp * m * 4 * 1.64
    # an end stage sends m (2v - 1) = 2 (p = 2: both are ends); 8 GPUs > a node: the network
    assert t["p2p"] == pytest.approx(2 * (1.0 + 64 / 2 / 10))
    first = 2 * 2 * per_layer / 2 / (1000 * 0.5)          # the first stage's compute: no head, 79.872
    assert t["bubble"] == pytest.approx((first + 26.24 + 8.4) / 2)       # the other stage, once: 57.256
    # ZeRO-1: reduce-scatter + all-gather of stage 0's 282 bf16 params inside the node = one all-reduce
    assert t["data"] == pytest.approx(2 * 1 * (0.5 + 564 / (2 * 100)))
    assert t["total"] == pytest.approx(86.016 + 26.24 + 8.4 + 57.256 + 6.64)
    # with p = 1 the busiest stage is the average: the step's executed FLOPs over the GPUs
    one = planner.step_time(TOY, CLUSTER, 8, 1, 2, 4, 1, zero=0, recompute="full")
    assert one["compute"] == pytest.approx(planner.executed_flops(TOY, 8, "full") / (8 * 1000 * 0.5))


def test_traffic_by_hand():
    # dp = tp = pp = 2, batch 8, b = 1: m = 4 micro-batches; a = 2 b s h = 64 B; stage 0: 2 layers of
    # (1000 - 128)/4/2 = 109 params per GPU and the word embedding 128/2: 282 params, 564 B
    f = lambda **kw: planner.traffic(TOY, 8, 1, 2, 2, 2, **kw)     # noqa: E731
    t = f(recompute="none")
    assert t["tensor"] == {"calls": 32, "bytes": 32 * 64, "kind": {"all_reduce": 32},
                           "kind_bytes": {"all_reduce": 32 * 64}}             # 2 layers x 4 x m
    assert f(recompute="full")["tensor"]["kind"] == {"all_reduce": 48}        # + 2 in the recomputation
    sp = f(recompute="none", sequence_parallel=True)["tensor"]
    assert sp["kind"] == {"all_gather": 32, "reduce_scatter": 32} and sp["bytes"] == 64 * 64
    assert t["pipeline"]["kind"] == {"send": 4} and t["pipeline"]["bytes"] == 4 * 32   # m sends of a/t
    assert f(recompute="none", chunks=2)["pipeline"]["calls"] == 12    # m (2v - 1): p = 2, both ends
    deep = lambda stage: planner.traffic(TOY, 8, 1, 1, 2, 4, stage=stage)["pipeline"]["calls"]  # noqa
    assert [deep(i) for i in (0, 1, 2, 3, None)] == [8, 16, 16, 8, 16]   # m = 8: ends one way
    assert t["data"]["kind_bytes"] == {"all_reduce": 564} and t["data"]["calls"] == 1          # ZeRO-0
    assert f(zero=1)["data"]["kind_bytes"] == {"reduce_scatter": 564, "all_gather": 564}
    assert f(zero=2)["data"]["kind"] == {"reduce_scatter": 4, "all_gather": 1}
    z3 = f(zero=3, recompute="none")["data"]
    assert z3["kind"] == {"all_gather": 4 * (2 * 2 + 1), "reduce_scatter": 4 * 3}    # layers x 2 + root
    assert z3["kind_bytes"] == {"all_gather": 4 * (2 * 2 * 218 + 128), "reduce_scatter": 4 * 564}
    assert f(zero=3, recompute="full")["data"] == z3                 # FSDP2: no gather for recomputation
    none = planner.traffic(TOY, 8, 1, 8, 1, 1)
    assert all(d["calls"] == 0 == d["bytes"] for k, d in none.items() if k != "data")


def test_step_time_takes_its_traffic_from_traffic(monkeypatch):
    args = (TOY, CLUSTER, 8, 1, 2, 2, 2)
    t = planner.step_time(*args, zero=3, recompute="none")  # 20 gathers, 12 reduce-scatters on 2 ranks
    assert t["data"] == pytest.approx(20 * 0.5 + 4000 / 200 + 12 * 0.5 + 2256 / 200)
    assert t["traffic"] == planner.traffic(*args[:1], *args[2:], zero=3, recompute="none")
    # negative control: a traffic() that doubles every S changes every communication term
    real = planner.traffic
    doubled = lambda *a, **k: {d: dict(v, kind_bytes={n: 2 * b for n, b in v["kind_bytes"].items()})  # noqa: E731
                               for d, v in real(*a, **k).items()}
    monkeypatch.setattr(planner.step, "traffic", doubled)   # where step_time looks it up
    t2 = planner.step_time(*args, zero=3, recompute="none")
    assert all(t2[k] > t[k] for k in ("tensor", "p2p", "data")) and t2["compute"] == t["compute"]


def test_overlap_is_capped_by_the_backward():
    args = (TOY, CLUSTER, 8, 1, 2, 2, 2)
    data = planner.step_time(*args, zero=3, recompute="none")["data"]        # 47.28 s, nothing hidden
    assert planner.backward_share(TOY, 1, 2, 2, "none") == pytest.approx(2 / 3)
    assert 0.7 < planner.backward_share(TOY, 1, 2, 2, "full") < 0.75          # + the recomputed forward
    # compute 172 s: the backward's 115 s hide all of it at overlap 1, 3/4 of it at 0.75
    assert planner.step_time(*args, zero=3, recompute="none", overlap=1.0)["data"] == 0.0
    assert planner.step_time(*args, zero=3, recompute="none", overlap=0.75)["data"] == pytest.approx(data / 4)
    # a GPU 100 x faster: compute 1.72 s, its backward 1.15 s; the traffic exceeds it and only that is hidden
    fast = dict(CLUSTER, peak_flops=1e5)
    t = planner.step_time(TOY, fast, 8, 1, 2, 2, 2, zero=3, recompute="none", overlap=1.0)
    assert t["compute"] < data and t["hidden"] == pytest.approx(2 / 3 * t["compute"])
    assert t["data"] == pytest.approx(data - 2 / 3 * t["compute"]) and t["data"] > 0.9 * data
    assert t["total"] >= data                              # never faster than its own traffic


def test_flops_formulas():
    gpt3 = {"layers": 96, "hidden": 12288, "heads": 96, "vocab": 51200, "seq": 2048, "params": None}
    assert planner.param_count(gpt3) == pytest.approx(174.6e9, abs=0.05e9)   # Eq. 2
    assert planner.executed_flops(gpt3, 8, "full") == pytest.approx(planner.paper_flops(gpt3, 8))
    assert planner.executed_flops(gpt3, 8, "none") == pytest.approx(
        planner.paper_flops(gpt3, 8) - 24 * 8 * 2048 * 96 * 12288 ** 2 * (1 + 2048 / (6 * 12288)))


def test_feasibility_rules():
    six_heads = dict(TOY, heads=6)
    assert "heads" in planner.check(six_heads, CLUSTER, 8, 1, 2, 4, 1)
    assert all(tp in (1, 2) for _, tp, _ in planner.layouts(8, 4, 6, 4))      # 4 does not divide 6
    assert "layers" in planner.check(TOY, CLUSTER, 8, 1, 1, 1, 8)             # pp = 8 > 4 layers
    assert "node" in planner.check(dict(TOY, heads=4), dict(CLUSTER, gpus_per_node=2, nodes=4), 8, 1, 2, 4, 1)
    assert "batch" in planner.check(TOY, CLUSTER, 6, 1, 4, 2, 1)              # 6 % 4
    assert "GPUs" in planner.check(TOY, CLUSTER, 8, 1, 1, 2, 2)
    with pytest.raises(ValueError):
        planner.evaluate(six_heads, CLUSTER, 8, 1, 2, 4, 1)
    assert planner.check(TOY, CLUSTER, 8, 1, 2, 2, 2) is None


def test_memory_budget_excludes():
    everything = planner.plan(TOY, CLUSTER, 8)
    budget = sorted(r["memory"]["total"] for r in everything)[len(everything) // 2]
    tight = planner.plan(TOY, dict(CLUSTER, memory=budget), 8)
    assert 0 < len(tight) < len(everything)
    assert all(r["memory"]["total"] <= budget for r in tight)
    reserved = planner.plan(TOY, dict(CLUSTER, memory=budget, reserve=0.1), 8)   # 10 % kept free
    assert 0 < len(reserved) < len(tight) and all(r["memory"]["total"] <= 0.9 * budget for r in reserved)
    assert len(planner.plan(TOY, dict(CLUSTER, memory=1.0), 8)) == 0


def test_rates_never_above_peak_times_efficiency():
    # executed FLOP/s count only work done: at most peak x efficiency; the paper's metric (Eq. 3) equals
    # it with full recomputation and exceeds it without (it counts a forward that did not run)
    for r in planner.plan(TOY, CLUSTER, 8):
        cap = CLUSTER["peak_flops"] * CLUSTER["efficiency"] / 1e12
        assert 0 < r["executed"] <= cap * (1 + 1e-12) and r["mfu"] <= CLUSTER["efficiency"]
        if r["recompute"] == "full":
            assert r["tflops"] == pytest.approx(r["executed"])
        else:
            assert r["tflops"] > r["executed"]


def test_ranking_order():
    ranked = planner.plan(TOY, CLUSTER, 8)
    keys = [(r["time"]["total"], r["memory"]["total"]) for r in ranked]
    assert keys == sorted(keys)
    # the first is the fastest of every valid configuration, found independently
    best = min((planner.evaluate(TOY, CLUSTER, 8, b, dp, tp, pp, z, rc)
                for dp, tp, pp in planner.layouts(8, 4, 2, 4) for b in (1, 2, 4, 8) for z in range(4)
                for rc in planner.RECOMPUTE if planner.check(TOY, CLUSTER, 8, b, dp, tp, pp) is None),
               key=lambda r: r["time"]["total"])
    assert ranked[0]["time"]["total"] == best["time"]["total"]
    layouts = planner.best_per_layout(ranked)
    assert len({(r["dp"], r["tp"], r["pp"]) for r in layouts}) == len(layouts)


def test_slow_network_keeps_gradients_inside_the_node():
    # big weights, tiny activations, a slow network: the gradient all-reduce must not cross it,
    # so the planner pipelines across nodes (the paper's Takeaway #1 in the small)
    model = dict(TOY, params=10 ** 7)
    slow = dict(CLUSTER, inter_bw=1e3, intra_bw=1e9, peak_flops=1e9)
    best = planner.plan(model, slow, 8, recomputes=("none",))[0]
    assert best["tp"] * best["dp"] <= slow["gpus_per_node"] and best["pp"] > 1


def test_ring_costs_are_the_helpers():
    # one definition of lecture 02's ring formulas in the series
    assert planner.ring_all_reduce is cost.ring_all_reduce and planner.ring_all_gather is cost.ring_all_gather
    from machinery.l14_planner import counts as planner_counts
    assert planner_counts.COST["reduce_scatter"] is cost.ring_reduce_scatter


# ------------------------------------------------------------- small-model mode (nd3d's tiny GPT)

CFG = dict(vocab=64, dim=32, heads=4, depth=4, seq=16, batch=8)
# a cluster whose numbers can be followed by hand: 1 GFLOP/s, a ring step 1e-4 s + n / 1 GB/s, a
# pipeline message 2e-4 s + n / 0.5 GB/s; float64 (8-byte) elements as nd3d's tiny GPT runs
NODE = {"gpus_per_node": 8, "nodes": 1, "memory": 1e12, "peak_flops": 1e9, "efficiency": 1.0,
        "intra_bw": 1e9, "intra_alpha": 1e-4, "inter_bw": 1e9, "inter_alpha": 1e-4,
        "p2p_bw": 5e8, "p2p_alpha": 2e-4}


def tiny_step(dp, tp, pp, m, cfg=CFG, cluster=NODE):
    return planner.step_time(planner.tiny_model(cfg), cluster, cfg["batch"], cfg["batch"] // (dp * m),
                             dp, tp, pp, zero=0, recompute="none", element=8)


def test_executed_flops_equal_torch_count():
    # the formula 3 (24 B s l h^2 (1 + s/6h)) + 6 B s h V against torch's own count of the tiny GPT's
    # forward and backward (every matmul, including the first block's input gradient)
    from torch.utils.flop_counter import FlopCounterMode
    gpt = tiny.transformer(CFG["vocab"], CFG["dim"], CFG["heads"], CFG["depth"])
    ids, targets = tiny.tokens(CFG["batch"], CFG["seq"], CFG["vocab"])
    with FlopCounterMode(display=False) as counter:
        tiny.lm_loss(gpt(ids), targets).backward()
    assert counter.get_total_flops() == planner.executed_flops(planner.tiny_model(CFG), CFG["batch"])


def test_tiny_step_by_hand():
    h, s, V = 32, 16, 64
    t = tiny_step(dp=1, tp=2, pp=2, m=2)
    b = 4                                                    # 8 samples / (dp 1 x m 2)
    flops = 2 * 72 * b * s * h * h * (1 + s / (6 * h)) / 2 + 6 * b * s * h * V   # 2 blocks / tp, whole head
    act = 8 * b * s * h
    tensor = 2 * 4 * 2 * (1e-4 + act / (2 * 1e9))          # 2 blocks x 4 all-reduces, ring of 2
    p2p = 2e-4 + act / 5e8                                  # m (2v - 1) = 2 sends of act / t
    slot = flops / 1e9 + tensor + p2p
    assert t["compute"] == pytest.approx(2 * flops / 1e9)
    first = slot - 6 * b * s * h * V / 1e9                  # the first stage's: no head
    assert t["bubble"] == pytest.approx(first) and t["data"] == 0.0      # the other stage, once
    assert t["total"] == pytest.approx(2 * slot + first)
    one = tiny_step(1, 1, 1, 1)
    assert one["tensor"] == one["p2p"] == one["bubble"] == one["data"] == 0.0
    assert one["total"] == pytest.approx(planner.executed_flops(planner.tiny_model(CFG), 8) / 1e9)


def test_predict_is_step_time_on_the_scaled_model_and_the_node(monkeypatch):
    # one model: section 4's prediction is step_time on the GPT S times larger (bf16) and one node of
    # the machine model (its achieved GEMM rate, NCCL's NVLink step), traffic and bubble included
    from helpers import machines
    t = planner.predict(CFG, 128, dp=2, tp=2, pp=1, micro_batches=2)
    assert t["traffic"]["tensor"]["kind"] == {"all_reduce": 4 * 4 * 2}      # 4 per block, 4 blocks, m = 2
    assert t["traffic"]["data"]["kind"] == {"all_reduce": 1}
    big = planner.scaled_model(CFG, 128)
    assert (big["hidden"], big["seq"], big["vocab"], big["layers"]) == (4096, 2048, 8192, 4)
    node = planner.node_cluster(machines.H100)
    assert node["peak_flops"] * node["efficiency"] == machines.H100.gemm_flops
    assert (node["intra_alpha"], node["intra_bw"]) == machines.link(machines.H100)
    assert t == planner.step_time(big, node, 8, 2, 2, 2, 1, zero=0, recompute="none")
    monkeypatch.setattr(planner.modelled, "step_time", lambda *a, **k: {"total": -1.0})  # a changed model
    assert planner.predict(CFG, 128, 2, 2, 1, 2) == {"total": -1.0}        # ... is section 4's too


def test_tiny_gradient_bytes_match_the_model():
    # dp's all-reduce carries this rank's gradients: count them on the model, split as nd3d splits
    # (qkv and mlp.0 by rows, proj and mlp.2 weights by columns, the rest whole)
    gpt = tiny.transformer(CFG["vocab"], CFG["dim"], CFG["heads"], CFG["depth"])
    for tp, pp in ((1, 1), (2, 1), (2, 2), (4, 4)):
        split = ("qkv", "mlp.0", "proj.weight", "mlp.2.weight")
        last = [f"blocks.{i}." for i in range(CFG["depth"] - CFG["depth"] // pp, CFG["depth"])] + ["ln.", "head."]
        first = [f"blocks.{i}." for i in range(CFG["depth"] // pp)] + ["tok.", "pos."]
        count = lambda mine: sum(p.numel() / (tp if any(k in n for k in split) else 1)  # noqa: E731
                                 for n, p in gpt.named_parameters() if any(n.startswith(m) for m in mine))
        n = count(set(first + last)) if pp == 1 else max(count(first), count(last))
        t = tiny_step(dp=2, tp=tp, pp=pp, m=1)
        assert t["data"] == pytest.approx(cost.ring_all_reduce(8 * n, 2, 1e9, 1e-4)), (tp, pp)


def test_nd3d_layouts_are_the_splits_nd3d_runs():
    cfg = dict(CFG, heads=8, depth=8, batch=16)
    got = planner.nd3d_layouts(8, cfg)
    assert len(got) == 17 and len(planner.nd3d_layouts(4, cfg)) == 10
    assert all(d * t * p == 8 and cfg["batch"] % (d * m) == 0 for d, t, p, m, _ in got)
    assert {m for d, t, p, m, _ in got if p == 4} == {4, 8} and (1, 8, 1, 2, None) in got
    assert [lay for lay in got if lay[4]] == [(2, 1, 4, 8, (1, 3, 3, 1))]          # one uneven split
    assert not [lay for lay in planner.nd3d_layouts(8, dict(cfg, heads=4)) if lay[1] == 8]  # whole heads


# ------------------------------------------------------------------------------ the paper

def test_paper_table_and_comparison():
    paper.check_table()
    rows = paper.compare()
    assert len(rows) == len(paper.TABLE1) == 10
    assert all(math.isfinite(r["predicted TF/s"]) and r["rank_n"] for r in rows)
    fitted = rows[paper.FIT_ROW]
    assert fitted["fitted"] and abs(fitted["error"]) < 1e-6 and fitted["constant error"] == 0
    assert 0.3 < fitted["efficiency"] < 0.7
    # negative control: an efficiency not fitted misses the fitted row; a faster GPU moves every row up
    off = paper.compare(0.9 * fitted["efficiency"])
    assert off[paper.FIT_ROW]["error"] < -0.05
    assert all(f["predicted TF/s"] > r["predicted TF/s"] for f, r in zip(rows, off))
    # the trend: a least-squares line in log(params) without the row, computed independently
    import numpy as np
    x, y = np.log([r[0] for r in paper.TABLE1]), np.array([r[8] for r in paper.TABLE1], float)
    for i, r in enumerate(rows):
        keep = np.arange(len(x)) != i
        line = np.polyfit(x[keep], y[keep], 1)
        assert r["trend error"] == pytest.approx(np.polyval(line, x[i]) / y[i] - 1)
    skill = paper.skill(rows)
    assert skill["error"] == pytest.approx(np.median([abs(r["error"]) for r in rows if not r["fitted"]]))
    assert next(r for r in rows if r["model"] == "76.1B")["choice"] == "forced"      # 1 layout of 1


def test_table_rows_are_predicted_as_they_ran():
    # Megatron-LM's examples/sc21/run_table_1.sh: MBS 16 for 1.7B to 7.5B (outside 1 to 8), and
    # --num-layers-per-virtual-pipeline-stage 5 for 76.1B: v = 60 / (4 x 5) = 3 chunks
    assert [paper.chunks(r) for r in paper.TABLE1] == [1, 1, 1, 1, 1, 3, 2, 2, 3, 1]
    assert [b for b, _ in paper.AS_RUN] == [16, 16, 16, 8, 4, 2, 2, 1, 1, 1]
    run = paper.as_run(paper.TABLE1[5], paper.a100_cluster(1024, 0.5))
    assert (run["micro_batch"], run["chunks"], run["recompute"], run["m"]) == (2, 3, "full", 28)
    slot = sum(run["time"][k] for k in ("compute", "tensor", "context", "expert", "p2p"))
    model, cluster, (t, p) = paper.row_model(paper.TABLE1[5]), paper.a100_cluster(1024, 0.5), (8, 4)
    head = (planner.stage_flops(model, 2, t, p, "full") - planner.stage_flops(model, 2, t, p, "full",
                                                                                last=False))
    logits = 28 * head / (cluster["peak_flops"] * cluster["efficiency"])   # the last stage's alone
    # the fill and drain: the other stages' work of a micro-batch and chunk, (p - 1)/(v m) of the
    # last stage's without its logits, and the two middle stages' one send more (m (2v - 1) at an
    # end against 2 m v: 5 m against 6 m)
    extra = 2 * run["time"]["p2p"] / 5
    assert run["time"]["bubble"] == pytest.approx((3 * (slot - logits) + extra) / (3 * 28))
    # they ran, so the planner's memory lets every one; on a 40 GB A100 the 1T row would not (control)
    assert all(r["as run fits"] for r in paper.compare())
    assert not paper.as_run(paper.TABLE1[-1], dict(paper.a100_cluster(3072, 0.5), memory=40e9))["fits"]


def test_choice_marks_forced_ties_and_picks():
    ranked = lambda *ts: [{"time": {"total": t}} for t in ts]   # noqa: E731
    assert paper.choice(ranked(1.0), 1) == "forced"
    assert paper.choice(ranked(1.0, 1.01, 1.5), 2) == "tie of 2"
    assert paper.choice(ranked(1.0, 1.01, 1.5), 1) == "tie of 2"
    assert paper.choice(ranked(1.0, 1.1), 1) == "pick"
    assert paper.choice(ranked(1.0, 1.1), 2) == "not chosen, +10%"
    assert paper.choice(ranked(1.0), None) == "does not fit"


# ----------------------------------------------------------- layouts as production runs make them

FIVE = dict(TOY, layers=5)                              # 5 layers: p = 2 does not divide them


def test_unequal_stages_plan_a_layer_count_pp_does_not_divide():
    assert planner.stage_splits(126, 16) == [(7,) + (8,) * 14 + (7,)]     # Llama 3 405B's
    assert planner.stage_splits(12, 4)[0] == (3, 3, 3, 3)                 # k = L/p: equal
    assert planner.stage_splits(96, 64) == []                             # no k fits
    assert all(pp == 1 for _, _, pp in planner.layouts(8, 4, 2, 5))
    assert {pp for _, _, pp in planner.layouts(8, 4, 2, 5, uneven=True)} == {1, 2}
    # negative control: without a split, 5 layers on 2 stages are refused
    assert "layers" in planner.check(FIVE, CLUSTER, 8, 1, 4, 1, 2)
    assert "summing" in planner.check(FIVE, CLUSTER, 8, 1, 4, 1, 2, stages=(2, 2))
    # (dp, tp, pp) = (4, 1, 2), b = 1, m = 2, ZeRO-0, stages (2, 3): a layer (1000 - 128)/5 = 174.4
    mem = planner.memory(FIVE, CLUSTER, 8, 1, 4, 1, 2, 0, "none", stages=(2, 3))
    act = 4 * 1 * 8 * (34 + 5 * 2 * 4 / 8)                             # s b h (34 + 5as/h)
    first = 16 * (2 * 174.4 + 128) + 2 * act * 2                        # embedding, 2 in flight
    last = 16 * (3 * 174.4 + 128) + 3 * act * 1 + 6 * 4 * 16           # the copy, 1 in flight, logits
    assert mem["stages"] == [pytest.approx(first), pytest.approx(last)] and mem["stage"] == 1
    t = planner.step_time(FIVE, CLUSTER, 8, 1, 4, 1, 2, 0, "none", stages=(2, 3))
    one_forward = 24 * 4 * 5 * 64 * (1 + 4 / 48)
    busiest = 3 * (3 * one_forward / 5) + 6 * 4 * 8 * 16                # the last: 3 layers, logits
    assert t["stage"] == 1 and t["compute"] == pytest.approx(2 * busiest / 500)
    assert planner.stage_flops(FIVE, 1, 1, 2) < busiest                  # L // p = 2 would miss one
    # the data traffic is the fullest stage's parameters: the last's 651.2, not the first's 476.8
    assert t["traffic"]["data"]["kind_bytes"] == {"all_reduce": pytest.approx(2 * (3 * 174.4 + 128))}


def test_interleaving_divides_the_bubble_and_is_used_where_it_pays():
    args = (TOY, CLUSTER, 8, 1, 2, 2, 2)                                  # m = 4, p = 2
    one = planner.step_time(*args, zero=0, recompute="none")
    two = planner.step_time(*args, zero=0, recompute="none", chunks=2)
    assert two["p2p"] == pytest.approx(3 * one["p2p"]) and two["compute"] == one["compute"]  # 12 sends, 4
    head = 4 * 6 * 1 * 4 * 8 * 16 / 2 / (1000 * 0.5)                      # m = 4 logits, 6 b s h V / t
    first = two["compute"] - head + two["tensor"] + two["p2p"]          # the other stage: no head
    assert two["bubble"] == pytest.approx((2 - 1) / (2 * 4) * first)

    def chosen(cluster):                       # the chunks of the (2, 2, 2) layout's best
        return next(r["chunks"] for r in planner.plan(TOY, cluster, 8, chunks=(1, 2))
                    if (r["dp"], r["tp"], r["pp"]) == (2, 2, 2))
    assert chosen(dict(CLUSTER, p2p_bw=1e9, p2p_alpha=0.0)) == 2         # free sends: it pays
    assert chosen(dict(CLUSTER, p2p_bw=1e9, p2p_alpha=1e3)) == 1         # control: sends cost more


def test_the_last_stage_holds_a_copy_of_the_tied_embedding():
    # Megatron-LM with p > 1 keeps the word embedding on the first stage and a copy on the last for
    # the logits (their gradients all-reduced once per step); with p = 1 one stage holds it once
    split = planner.stage_param_split(TOY, 2, 2)                          # (dense, expert) per stage
    assert split == [(218 + 64, 0), (218 + 64, 0)]                       # 2 layers of 109, V h / t
    assert planner.stage_param_split(TOY, 2, 1) == [(436 + 64, 0)]
    untied = planner.stage_param_split(dict(TOY, head=0), 2, 2)           # control: no copy
    assert untied == [(218 + 64, 0), (218, 0)]
    assert planner.fullest_stage(TOY, 2, 2) == 0                         # the first among equals


def test_interleaved_memory_holds_each_stages_warm_up():
    # Megatron-LM's interleaved schedule: stage i runs 2(p - i - 1) + (v - 1)p forwards before its
    # first backward, so it holds that many chunks of n/v layers and one more. (dp, tp, pp) = (2, 2, 2),
    # v = 2, batch 32: m = 16, one layer a chunk. The first stage: 2 + 2 + 1 = 5 layers, L (1 + (p-1)/(p v))
    # (Korthikanti et al. 2022); the last: 0 + 2 + 1 = 3 layers, where 1F1B holds one micro-batch's 2
    per_layer = planner.activation_bytes_per_layer(TOY, 1, 2, "none", True)
    one = planner.memory(TOY, CLUSTER, 32, 1, 2, 2, 2, 0, "none")["stages"]
    two = planner.memory(TOY, CLUSTER, 32, 1, 2, 2, 2, 0, "none", chunks=2)["stages"]
    assert two[0] - one[0] == pytest.approx(per_layer)                   # 5 layers against 4
    assert two[1] - one[1] == pytest.approx(per_layer)                   # 3 against 2, not 2.5
    few = planner.memory(TOY, CLUSTER, 4, 1, 2, 2, 2, 0, "none", chunks=2)["stages"]   # m v = 4 chunks
    assert few[0] == planner.memory(TOY, CLUSTER, 4, 1, 2, 2, 2, 0, "none")["stages"][0]
    # interleaving without a pipeline is refused (it would only repeat v = 1)
    assert "pipeline" in planner.check(TOY, CLUSTER, 8, 1, 4, 2, 1, chunks=2)


def test_context_parallelism_by_hand():
    # 8 GPUs as (dp, tp, pp, cp) = (2, 2, 1, 2); m = 4; a = 2 b (s/cp) h = 32 bytes
    f = lambda **kw: planner.traffic(TOY, 8, 1, 2, 2, 1, zero=0, cp=2, **kw)   # noqa: E731
    t = f(recompute="none")
    assert t["context"]["kind"] == {"send": 4 * 4 * (3 * 2 - 2)}          # L m (3c - 2)
    assert t["context"]["bytes"] == 64 * (2 * 32 / 2)                     # K and V over tp
    assert f(recompute="full")["context"]["calls"] == 4 * 4 * (3 * 2 - 2 + 1)
    assert t["tensor"]["kind_bytes"] == {"all_reduce": 64 * 32}           # half of cp = 1's
    step = planner.step_time(TOY, CLUSTER, 8, 1, 2, 2, 1, 0, "none", cp=2)
    assert step["compute"] == pytest.approx(4 * planner.stage_flops(TOY, 1, 2, 1) / 2 / 500)
    assert step["context"] == pytest.approx(64 * (0.5 + 32 / 100))        # t c = 4: one node
    # the gradients: over the d c = 4 ranks holding the same weights, across the 2 nodes
    assert step["data"] == pytest.approx(cost.ring_all_reduce(1000, 4, 10.0, 1.0))
    assert step["data"] != pytest.approx(cost.ring_all_reduce(1000, 2, 10.0, 1.0))   # control: d alone
    mem = planner.memory(TOY, CLUSTER, 8, 1, 2, 2, 1, 1, "none", cp=2)
    assert mem["optim"] == 12 * 500 / 4
    assert mem["activations"] == 4 * planner.activation_bytes_per_layer(TOY, 1, 2, "none", True) / 2
    assert "sequence" in planner.check(TOY, CLUSTER, 8, 1, 1, 2, 1, cp=4)     # s = 4: 8 chunks
    assert "GPUs" in planner.check(TOY, CLUSTER, 8, 1, 2, 2, 2, cp=2)


def test_expert_parallelism_by_hand():
    moe = dict(TOY, params=None, experts=4, top_k=2)
    dense = dict(TOY, params=None)
    assert planner.param_count(moe) == pytest.approx(planner.param_count(dense) + 4 * 3 * 8 * 64)
    assert planner.executed_flops(moe, 8) - planner.executed_flops(dense, 8) == pytest.approx(
        3 * 16 * 1 * 8 * 4 * 4 * 64)                                      # k - 1 = 1 more MLP
    assert "ep" in planner.check(TOY, CLUSTER, 8, 1, 4, 2, 1, ep=2)       # a dense GPT: ep = 1
    assert "ep" in planner.check(moe, CLUSTER, 8, 1, 4, 2, 1, ep=3)       # 3 does not divide 4
    # (dp, tp, pp) = (4, 2, 1), ep = 2: m = 2, a = 64 bytes, 4 all-to-alls of k a / t per layer:
    # each tensor-parallel rank dispatches its sequence-parallel half of the tokens (Megatron-Core)
    t = planner.traffic(moe, 8, 1, 4, 2, 1, zero=0, recompute="none", ep=2)
    assert t["expert"]["kind"] == {"all_to_all": 4 * 4 * 2}
    assert t["expert"]["bytes"] == 32 * 2 * 64 / 2                      # not k a: t times less
    # with sequence parallelism the MLP's gather and scatter carry the k a routed tokens (32 of each
    # kind: 16 the attention's of a, 16 the MLP's of k a); without ep, the tokens once (control)
    sp = planner.traffic(moe, 8, 1, 4, 2, 1, zero=0, recompute="none", ep=2, sequence_parallel=True)
    assert sp["tensor"]["kind_bytes"] == {"all_gather": 16 * 64 + 16 * 2 * 64,
                                          "reduce_scatter": 16 * 64 + 16 * 2 * 64}
    one = planner.traffic(moe, 8, 1, 4, 2, 1, zero=0, recompute="none", sequence_parallel=True)
    assert one["tensor"]["kind_bytes"]["all_gather"] == 32 * 64
    layer, expert = planner.layer_params(moe, 2, 2)
    assert expert == 2 * 8 * 64 / 2                                       # E/ep experts, over tp
    assert t["expert_data"]["kind_bytes"] == {"all_reduce": 2 * 4 * expert}
    assert t["data"]["kind_bytes"] == {"all_reduce": pytest.approx(2 * (4 * layer + 128 / 2))}
    step = planner.step_time(moe, CLUSTER, 8, 1, 4, 2, 1, 0, "none", ep=2)
    assert step["expert"] == pytest.approx(32 * (0.5 + 64 / (2 * 100)))
    mem = planner.memory(moe, CLUSTER, 8, 1, 4, 2, 1, 1, "none", ep=2)
    assert mem["optim"] == pytest.approx(12 * ((4 * layer + 64) / 4 + 4 * expert / 2))
    no_ep = planner.traffic(moe, 8, 1, 4, 2, 1, zero=0, recompute="none")   # control: ep = 1
    assert no_ep["expert"]["calls"] == 0 and no_ep["expert_data"]["kind_bytes"] == {
        "all_reduce": 2 * 4 * 2 * expert}                                 # all 4 experts, over 4 ranks


def test_memory_holds_the_logits_and_fp32_main_gradients():
    one = planner.memory(TOY, CLUSTER, 8, 2, 4, 2, 1, 0, "none")          # p = 1: one stage
    assert one["logits"] == 6 * 4 * 2 * 16 / 2                          # s b V / t, bf16 + fp32
    assert one["total"] == pytest.approx(sum(one[k] for k in (
        "params", "grads", "optim", "activations", "working", "logits")))
    two = planner.memory(TOY, CLUSTER, 8, 1, 2, 2, 2, 0, "none")          # p = 2: on the last
    assert two["logits"] == 0 and two["stage"] == 0
    assert two["stages"][1] == pytest.approx(16 * (218 + 64) + 2 * 624 + 6 * 4 * 16 / 2)   # + V h / t
    main = planner.memory(TOY, CLUSTER, 8, 2, 4, 2, 1, 0, "none", main_grads=True)
    assert main["grads"] == 2 * one["grads"] and main["params"] == one["params"]
    t = planner.traffic(TOY, 8, 1, 2, 2, 2, zero=1, main_grads=True)
    assert t["data"]["kind_bytes"] == {"reduce_scatter": 4 * 282, "all_gather": 2 * 282}
    assert planner.traffic(TOY, 8, 1, 2, 2, 2, zero=1)["data"]["kind_bytes"]["reduce_scatter"] == 564


def test_zero_2_and_3_with_a_pipeline_pay_their_calls_in_every_slot():
    args = (TOY, CLUSTER, 8, 1, 2, 2, 2)                                  # m = 4, p = 2
    for zero in (1, 2, 3):
        t = planner.step_time(*args, zero=zero, recompute="none")
        head = 4 * 6 * 1 * 4 * 8 * 16 / 2 / (1000 * 0.5)                  # m = 4 logits: the last stage's
        first = t["compute"] - head + t["tensor"] + t["p2p"]            # the other stage's slot
        per_micro_batch = {1: 0.0, 2: 4 * (0.5 + 564 / 200), 3: t["data"]}[zero]
        assert t["bubble"] == pytest.approx((2 - 1) / 4 * (first + per_micro_batch)), zero
    flat = planner.step_time(TOY, CLUSTER, 8, 1, 4, 2, 1, zero=3, recompute="none")
    assert flat["bubble"] == 0                                           # control: no pipeline


def test_options_only_add_choices():
    for model, more in ((FIVE, dict(uneven=True)), (TOY, dict(chunks=(1, 2))), (TOY, dict(cps=(1, 2)))):
        base, ranked = planner.plan(model, CLUSTER, 8), planner.plan(model, CLUSTER, 8, **more)
        assert len(ranked) > len(base) and ranked[0]["time"]["total"] <= base[0]["time"]["total"]
    base = planner.plan(TOY, CLUSTER, 8)
    main = planner.plan(TOY, CLUSTER, 8, main_grads=True)                 # costs, never gains
    assert main[0]["time"]["total"] >= base[0]["time"]["total"] and len(main) <= len(base)
