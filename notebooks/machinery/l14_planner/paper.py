"""Published tables the planner (notebooks/machinery/l14_planner/step.py) is put on: the GPT-3 family, and Narayanan et al. 2021 (SC21, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", arXiv:2104.04473), Table 1, as data, and the planner put on the same models and GPUs.

    from machinery.l14_planner import paper
    model = paper.gpt3("GPT-3 175B")          # {"layers": 96, "hidden": 12288, ...} for machinery.l14_planner
    rows = paper.compare()                    # one dict per Table 1 row: theirs, the planner's (efficiency
    paper.table(rows)                         # fitted on row FIT_ROW), the constant's and the trend's
    paper.skill(rows)                         # median |error| of each over the rows not fitted

Table 1 of arXiv:2104.04473v5, transcribed from a public reading note of the paper ("Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM - 技术点深读", citing v5; the
Megatron-LM README shows the same table as an image, images/cases_april2021.png). Cross-checked:
check_table() recomputes every row's parameters with the paper's Eq. 2 (within 1 %) and its aggregate
PFLOP/s and % of peak from the per-GPU TFLOP/s; the abstract's 1T row (502 PFLOP/s on 3072 GPUs, 52 %).
All rows: vocabulary 51,200, sequence 2048, A100 80GB in DGX A100 nodes (Selene). How each row ran
(the micro-batch size and the interleaved schedule's layers per chunk, which the table does not
print): Megatron-LM's examples/sc21/run_table_1.sh, the script that reproduces it (AS_RUN).
"""
import math
import statistics

from machinery import l14_planner as planner

# The GPT-3 family as the UvA reading's table gives it (from Brown et al. 2020, Table 2.1): layers,
# d_model, heads, batch in tokens. The table (and the GPT-3 paper) print d_model = 5140 for 13B; its 40
# heads of 128 make 5120, and 5140 is not divisible by 40: 5120 here.
GPT3 = {"GPT-3 Small": (12, 768, 12, 0.5e6), "GPT-3 Medium": (24, 1024, 16, 0.5e6),
        "GPT-3 Large": (24, 1536, 16, 0.5e6), "GPT-3 XL": (24, 2048, 24, 1e6),
        "GPT-3 2.7B": (32, 2560, 32, 1e6), "GPT-3 6.7B": (32, 4096, 32, 2e6),
        "GPT-3 13B": (40, 5120, 40, 2e6), "GPT-3 175B": (96, 12288, 96, 3.2e6)}
GPT3_VOCAB = 50257   # GPT-2's byte-pair vocabulary, which GPT-3 uses


def gpt3(name, seq=2048):
    """The planner's model dict of a GPT-3 family member."""
    layers, hidden, heads, _ = GPT3[name]
    return {"layers": layers, "hidden": hidden, "heads": heads, "vocab": GPT3_VOCAB, "seq": seq, "params": None}


# params (B), heads, hidden, layers, tensor t, pipeline p, GPUs, batch, TFLOP/s per GPU, % of peak, PFLOP/s
TABLE1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 44, 4.4),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 44, 8.8),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 46, 18.2),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 34.6),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 70.8),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 143.8),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 227.1),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 297.4),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 410.2),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 502.0),
]
VOCAB, SEQ = 51200, 2048
# How each row ran: Megatron-LM's examples/sc21/run_table_1.sh, the script that reproduces Table 1
# (the table does not print them): the micro-batch size (MBS) and the layers per virtual pipeline
# stage (--num-layers-per-virtual-pipeline-stage; None: the plain 1F1B schedule), so v = L/(p n)
# chunks; every row with full recomputation (--activations-checkpoint-method uniform).
AS_RUN = [(16, None), (16, None), (16, None), (8, None), (4, None), (2, 5), (2, 5), (1, 3), (1, 1),
          (1, None)]
MICRO = (1, 2, 4, 8, 16)   # the micro-batch sizes the planner tries (theirs among them)
# What Megatron-LM had in 2021: no ZeRO, no sequence parallelism, full recomputation or none,
# the interleaved schedule (the paper's section 2.2.2) with up to 6 chunks per stage.
MEGATRON_2021 = dict(zero_stages=(0,), recomputes=("none", "full"), sequence_parallel=False,
                     chunks=(1, 2, 3, 4, 5, 6))


def a100_cluster(gpus, efficiency=0.6, reserve=0.1):
    """DGX A100 nodes: 8 A100 80GB, 312 TFLOP/s dense bf16, NVSwitch 300 GB/s per GPU per direction,
    8 x 200 Gb/s HDR InfiniBand (one 25 GB/s NIC per GPU) (NVIDIA's A100 and DGX A100 datasheets; the
    paper's section 5). Latencies assumed (5, 10 us): below 0.1 % of these steps, messages are MBs.
    reserve: the fraction of the 80 GB kept free (workspace, fragmentation)."""
    return {"gpus_per_node": 8, "nodes": gpus // 8, "memory": 80e9, "reserve": reserve, "peak_flops": 312e12,
            "efficiency": efficiency, "intra_bw": 300e9, "intra_alpha": 5e-6,
            "inter_bw": 200e9 / 8, "inter_alpha": 10e-6}


def row_model(row):
    return {"layers": row[3], "hidden": row[2], "heads": row[1], "vocab": VOCAB, "seq": SEQ, "params": None}


def check_table():
    """The transcription against itself, so that a mistyped cell shows."""
    for row in TABLE1:
        p = planner.param_count(row_model(row)) / 1e9
        assert abs(p - row[0]) <= 0.01 * row[0] + 0.05, (row, p)           # Eq. 2
        assert abs(row[8] * row[6] / 1000 - row[10]) <= 0.006 * row[10] + 0.1, row
        assert abs(row[8] / 312 * 100 - row[9]) < 1.0, row                   # % of the 312 TFLOP/s peak


def chunks(row):
    """v, the interleaved schedule's chunks per stage, of Table 1's `row` as run (AS_RUN)."""
    layers, p, per_chunk = row[3], row[5], AS_RUN[TABLE1.index(row)][1]
    return 1 if per_chunk is None else layers // (p * per_chunk)


def as_run(row, cluster):
    """Their configuration as it ran (AS_RUN): their t, p, micro-batch size and interleaving, full
    recomputation (Eq. 3 counts it), no ZeRO, no sequence parallelism. Evaluated whether or not the
    planner's memory model says it fits (it ran): "fits" says whether it does."""
    model, (t, p, gpus, batch) = row_model(row), row[4:8]
    b = AS_RUN[TABLE1.index(row)][0]
    return planner.evaluate(model, cluster, batch, b, gpus // (t * p), t, p, 0, "full", False,
                            chunks=chunks(row))


FIT_ROW = 0      # the row the efficiency is fitted on: 1.7B, t = p = 1, the one layout without tensor or
                 # pipeline terms, so the fitted efficiency carries the least of the model's other terms
TIE = 0.02       # layouts whose best steps are within 2 % of the fastest are a tie for the planner


def fit_efficiency(row=FIT_ROW, lo=0.05, hi=1.0, iters=60):
    """The efficiency at which the planner's TF/s for Table 1's `row` as run equal the paper's
    (bisection: the predicted rate rises with the efficiency)."""
    row = TABLE1[row]
    for _ in range(iters):
        mid = (lo + hi) / 2
        run = as_run(row, a100_cluster(row[6], mid))
        lo, hi = (mid, hi) if run["tflops"] < row[8] else (lo, mid)
    return (lo + hi) / 2


def trend(row):
    """The trend baseline for Table 1's `row`: TF/s = a + b ln(params), least squares on the other rows."""
    xs = [math.log(r[0]) for i, r in enumerate(TABLE1) if i != row]
    ys = [r[8] for i, r in enumerate(TABLE1) if i != row]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my + b * (math.log(TABLE1[row][0]) - mx)


def choice(ranked, rank):
    """How their layout stands among the planner's layouts (each at its best): "forced" (the only
    one that fits), "tie of k" (k layouts within TIE of the fastest, theirs among them), "pick" (the
    planner's first by more than TIE), or "not chosen, +x %" (its step that much longer)."""
    if rank is None:
        return "does not fit"
    if len(ranked) == 1:
        return "forced"
    fastest = ranked[0]["time"]["total"]
    close = sum(r["time"]["total"] <= fastest * (1 + TIE) for r in ranked)
    if ranked[rank - 1]["time"]["total"] <= fastest * (1 + TIE):
        return "pick" if close == 1 else f"tie of {close}"
    return f"not chosen, +{ranked[rank - 1]['time']['total'] / fastest - 1:.0%}"


def compare(efficiency=None):
    """Per Table 1 row: their t, p, d and TF/s; the planner's TF/s for their configuration as run, at
    `efficiency` (None: fitted on row FIT_ROW, fit_efficiency) and its error, beside two baselines'
    errors, the constant (the fitted row's TF/s for every row) and the trend (trend()); the planner's
    best layout (2021 options, interleaving included), its executed TF/s (work done: Eq. 3's metric would count a forward it
    does not run) and how much longer their configuration's step is; the rank of theirs among the
    layouts, each at its best, and `choice`; the largest time terms by which their layout at its best
    differs from the planner's best, its recomputation and whether it fits without recomputation."""
    check_table()
    efficiency = fit_efficiency() if efficiency is None else efficiency
    out = []
    for i, row in enumerate(TABLE1):
        model, (t, p, gpus, batch, tflops) = row_model(row), row[4:9]
        d, cluster = gpus // (t * p), a100_cluster(gpus, efficiency)
        run = as_run(row, cluster)
        ranked = planner.best_per_layout(planner.plan(model, cluster, batch, MICRO, **MEGATRON_2021))
        rank = next((i + 1 for i, r in enumerate(ranked) if (r["tp"], r["pp"], r["dp"]) == (t, p, d)), None)
        best, theirs = ranked[0], (ranked[rank - 1] if rank else None)
        v = chunks(row)
        fits_none = any(planner.evaluate(model, cluster, batch, b, d, t, p, 0, "none", False, chunks=v)["fits"]
                        for b in MICRO if not planner.check(model, cluster, batch, b, d, t, p, v))
        gaps = {k: theirs["time"][k] - best["time"][k] for k in ("compute", "tensor", "p2p", "bubble", "data")} \
            if theirs else {}
        why = ", ".join(f"{k} {v:+.2f} s" for k, v in sorted(gaps.items(), key=lambda kv: -abs(kv[1]))[:2]
                        if abs(v) > 5e-3) if rank != 1 else ""
        out.append({"model": f"{row[0]:g}B", "GPUs": gpus, "t,p,d": f"{t},{p},{d}",
                    "b,v": f"{run['micro_batch']},{run['chunks']}", "as run fits": run["fits"],
                    "paper TF/s": tflops, "predicted TF/s": run["tflops"], "error": run["tflops"] / tflops - 1,
                    "constant error": TABLE1[FIT_ROW][8] / tflops - 1, "trend error": trend(i) / tflops - 1,
                    "fitted": i == FIT_ROW, "efficiency": efficiency,
                    "rank": f"{rank}/{len(ranked)}" if rank else "-", "rank_n": rank, "choice": choice(ranked, rank),
                    "planner t,p,d": f"{best['tp']},{best['pp']},{best['dp']}",
                    "planner b,v, recompute": f"{best['micro_batch']},{best['chunks']}, {best['recompute']}",
                    "planner executed TF/s": best["executed"],
                    "step vs planner's": run["time"]["total"] / best["time"]["total"] - 1,
                    "theirs minus planner's": why, "theirs": theirs, "fits without recompute": fits_none,
                    "run": run, "best": best})
    return out


def skill(rows):
    """Median |error| over the rows not fitted: the planner's, the constant's and the trend's."""
    kept = [r for r in rows if not r["fitted"]]
    return {k: statistics.median(abs(r[k]) for r in kept) for k in ("error", "constant error", "trend error")}


def table(rows):
    """compare's rows; the errors and "step vs planner's" (relative) as signed percentages."""
    from helpers import report
    pct = ("error", "constant error", "trend error", "step vs planner's")
    rows = [{**r, **{k: f"{r[k]:+.1%}" for k in pct if isinstance(r[k], float)}} for r in rows]
    report.table(rows, ["model", "GPUs", "t,p,d", "b,v", "paper TF/s", "predicted TF/s", "error",
                        "constant error", "trend error", "rank", "choice", "planner t,p,d",
                        "planner b,v, recompute",
                        "planner executed TF/s", "step vs planner's", "theirs minus planner's"],
                 floatfmt="{:.3g}")
