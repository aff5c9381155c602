"""Goal of lecture 13: the planner's predicted step time of the 3D-parallel tiny GPT (notebooks/nd3d.py)
against the measured one, median relative error over the configurations run here <= 25 %.

    .venv/bin/python bench/planner.py [--world-size 2] [--rounds 3] [--steps 5] [--dim 64 --seq 32 --batch 16]

On K ranks (2 by default; 4 also runs, on a 2-core machine oversubscribed, and says so) it runs, in
`rounds` rounds, (1) this machine's figures with K ranks busy at once: compute t = c0 + F/R fitted to the
single-process step's executed FLOPs F and times at the whole batch and its halvings (R the FLOP/s per
rank, c0 a pass's fixed cost), alpha and B of a ring step (an all-reduce sweep, nccl-tests'
method, helpers.bench) and of a message (send_recv); (2) nd3d.train for every (dp, tp, pp) of K ranks
that the model allows, timed per step on every rank (the slowest rank per step, medians), each run
checked afterwards against the single process (nd3d.check, float64, 1e-12), every round. The planner predicts each
configuration's step from (1) (helpers.planner.tiny_step_time, the planner's step_time on this machine's
figures). The defaults are lecture 13's section 4.1 parameters (PLAN_DIM, PLAN_SEQ_TINY, PLAN_BATCH_TINY,
PLAN_MICRO, PLAN_STEPS, PLAN_ROUNDS) and the measurement is its functions (planner.run_rank, planner.compare); the table prints predicted, measured
(medians, the series' convention: the goal's figure), error, and the median relative error against the
goal; a second line gives the same with the fastest figures and steps instead of medians (interference
from other work only adds time), for comparison. It prints the load average: on a shared machine other
work slows both the runs and the measured figures, by different amounts. It asserts no timing. Last, the paper check of section 4.2 (helpers.paper): the planner's median
|error| against Narayanan et al. 2021's Table 1 with its efficiency fitted on one row, beside a constant's
and the trend's.
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL = 0.25


def configurations(k, cfg, micro_batches):
    """Every (dp, tp, pp) with dp*tp*pp = k that the tiny GPT can be split into."""
    return [(k // (tp * pp), tp, pp) for tp in range(1, k + 1) for pp in range(1, k + 1)
            if k % (tp * pp) == 0 and cfg["heads"] % tp == 0 and cfg["depth"] % pp == 0
            and cfg["batch"] % (k // (tp * pp) * micro_batches) == 0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, nargs="+", default=[2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="steps per run (the first untimed)")
    ap.add_argument("--micro-batches", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    sys.path[:0] = [ROOT, os.path.join(ROOT, "notebooks")]
    import nd3d
    import torch

    from helpers import bench, machine as host, planner, report
    from helpers.spawn import spawn

    cfg = dict(nd3d.CFG, dim=args.dim, seq=args.seq, batch=args.batch)
    sizes = bench.size_range("4K", "4M", 4)           # the messages of these runs: 16 KiB to 2 MiB
    errors = []
    print(f"load average before: {os.getloadavg()[0]:.1f} (other work on the machine makes every timing slower and noisier)")
    for k in args.world_size:
        t0 = time.perf_counter()
        print(host.banner(k, "gloo"))
        configs = configurations(k, cfg, args.micro_batches)
        per_rank = spawn(planner.run_rank, k, args=(nd3d.train, cfg, configs, args.steps, args.micro_batches,
                                                    args.rounds, sizes), timeout=600)
        torch.set_num_threads(1)                             # the reference on one thread, as each rank runs
        for i in range(args.rounds):                         # every timed run, every round, equals the single process
            for c in configs:
                nd3d.check([r["runs"][i][c] for r in per_rank], cfg, args.steps)
        mach, rows, err = planner.compare(per_rank, cfg, args.micro_batches)
        print(f"tiny GPT {cfg}, {args.micro_batches} micro-batches, float64, {args.steps} steps per run (1 untimed), "
              f"{args.rounds} rounds with {k} ranks busy at once; every run equals the single process.")
        print(f"Medians (the series' convention): compute t = c0 + F/R with R = {mach['flops'] / 1e9:.2f} GFLOP/s per "
              f"rank, c0 = {mach['c0'] * 1e3:.2f} ms; ring step alpha {mach['ar_alpha'] * 1e6:.0f} us, "
              f"B {mach['ar_bw'] / 1e9:.2f} GB/s; message alpha {mach['p2p_alpha'] * 1e6:.0f} us, B {mach['p2p_bw'] / 1e9:.2f} GB/s")
        report.table(rows, list(rows[0]), floatfmt="{:.3g}")
        print(f"K={k}: median |predicted / measured - 1| = {err:.1%} ({time.perf_counter() - t0:.0f} s; "
              f"load average {os.getloadavg()[0]:.1f})")
        fast, fast_rows, fast_err = planner.compare(per_rank, cfg, args.micro_batches, stat=min)
        print(f"For comparison, fastest instead of medians (other work on the machine only adds time): R = "
              f"{fast['flops'] / 1e9:.2f} GFLOP/s, c0 = {fast['c0'] * 1e3:.2f} ms, ring alpha {fast['ar_alpha'] * 1e6:.0f} us; "
              "errors " + ", ".join(f"{r['dp,tp,pp']}: {r['error']:+.0%}" for r in fast_rows) + f"; median {fast_err:.1%}\n")
        errors += [abs(r["error"]) for r in rows]
    med = statistics.median(errors)
    print(f"median relative error over {len(errors)} configurations = {med:.1%}  (goal <= {GOAL:.0%}; "
          f"{'met' if med <= GOAL else 'not met'} in this run)")
    from helpers import paper
    rows = paper.compare()
    skill = paper.skill(rows)
    print(f"paper, Table 1, efficiency {rows[0]['efficiency']:.3f} fitted on {rows[paper.FIT_ROW]['model']}: "
          f"median |error| over the other {len(rows) - 1} rows: planner {skill['error']:.1%}, "
          f"constant {skill['constant error']:.1%}, trend {skill['trend error']:.1%}")


if __name__ == "__main__":
    main()
