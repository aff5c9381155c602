"""The goals of lectures 02-03, measured in one run and printed as ratios (never asserted).

    .venv/bin/python bench/collectives.py            # about a minute on 2 cores

1. from-scratch ring all-reduce busbw / library all-reduce busbw, K=2, sizes >= 16 MiB  (goal >= 0.9)
2. the alpha-beta fit's median relative error over an all-reduce size sweep, K=2        (goal <= 10%)
3. harness busbw / plain tight timing loop busbw, all-reduce of 64 MiB, K=2             (goal within 10%)

Every measurement is the harness's default, nccl-tests' method (one barrier, --calls calls back to
back timed as a loop, the ranks' mean), in rounds. The ring is the one lecture 02 builds and saves
(notebooks/course/ring_math.py, written from its #@save cells), so the benchmark measures the code
students read. Ring and library are measured in the same launch, taking turns round by round, so a
change in the machine's load hits both alike; the sweep of goal 2 takes its sizes in a shuffled order
round by round, for the same reason; goal 3's tight loop is written here from scratch (a barrier, the
calls, a host clock after a synchronize) and takes turns with the harness round by round.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from helpers import bench, cost, machine
from helpers.spawn import device, spawn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks"))
from course.ring_math import ring_all_reduce  # noqa: E402  lecture 02's ring, as it shows it

MiB = 2**20


# ----------------------------------------------------------------------- a plain tight loop

def tight_loop(x, iters):
    """Seconds per all-reduce: one barrier, then `iters` back-to-back calls timed as one block."""
    dist.barrier()
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    return (time.perf_counter() - t0) / iters


def harness_and_loop(rank, k, nbytes, rounds, iters):
    """In one launch, rounds taking turns: the harness's measurement, then a plain tight loop."""
    x = torch.zeros(nbytes // 4, device=device())
    plan = [("all_reduce", "all_reduce", None)]
    out = []
    for _ in range(rounds):
        harness = bench.measure_rank(rank, k, plan, [nbytes], warmup=1, iters=iters, check=False)
        dist.all_reduce(x)  # the loop's warm-up
        out.append((harness, tight_loop(x, iters)))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=5, help="calls per timed loop, nccl-tests' -n (default 5)")
    p.add_argument("--ring-rounds", type=int, default=9,
                   help="rounds of goal 1, every size and both all-reduces once per round (default 9)")
    p.add_argument("--rounds", type=int, default=21,
                   help="harness / tight-loop rounds of goal 3 (default 21)")
    p.add_argument("--max-bytes", default="64M", help="largest size of the fit's sweep (default 64M)")
    p.add_argument("--fit-rounds", type=int, default=40,
                   help="rounds of the fit's sweep, every size once per round (default 40: 200 calls a size; "
                        "with fewer, the medians of the small sizes stay noisy on a virtual machine)")
    a = p.parse_args()
    k = 2
    print(machine.banner(k, "nccl" if torch.cuda.device_count() >= k else "gloo"))
    load_before = os.getloadavg()[0]
    print(f"Load average (1 min) before: {load_before:.1f} on {machine.usable_cores()} cores "
          "(other programs running make every timing slower and noisier).\n")

    # Goal 1: ring (ours) against the library, interleaved, at 16, 32 and 64 MiB.
    sizes = [16 * MiB, 32 * MiB, 64 * MiB]
    rows = bench.sweep({"ring (ours)": ("all_reduce", ring_all_reduce), "library": "all_reduce"},
                       [k], sizes, warmup=2, iters=a.calls, rounds=a.ring_rounds, interleave=True, progress=False)
    by = {(r["collective"], r["size"]): r for r in rows}
    assert all(r["wrong"] == 0 for r in rows), "an all-reduce gave wrong values"
    ratios = [by[("ring (ours)", n)]["busbw"] / by[("library", n)]["busbw"] for n in sizes]
    for n, ratio in zip(sizes, ratios):
        print(f"  {n // MiB:3d} MiB: ring busbw {by[('ring (ours)', n)]['busbw']:.3f} GB/s, library "
              f"{by[('library', n)]['busbw']:.3f} GB/s, ratio {ratio:.2f}")
    goal1 = statistics.median(ratios)
    print(f"Goal 1: from-scratch ring / library all-reduce busbw (K=2, >= 16 MiB): median {goal1:.2f} "
          f"(min {min(ratios):.2f})   [goal >= 0.9]\n")

    # Goal 2: the alpha-beta fit over an all-reduce sweep.
    sweep_sizes = bench.size_range("4K", a.max_bytes, 2)
    rows = bench.sweep("all_reduce", [k], sweep_sizes, warmup=2, iters=a.calls, rounds=a.fit_rounds,
                       progress=False)
    sizes, times = [r["size"] for r in rows], [r["time_us"] * 1e-6 for r in rows]
    fit = cost.fit_alpha_beta(sizes, times)
    errors = fit.relative_errors()
    print("  size      time (us)   model (us)   error")
    for n, t, e in zip(sizes, times, errors):
        print(f"  {bench.human_size(n):>6}  {t * 1e6:11.0f}  {float(fit.predict(n)) * 1e6:11.0f}  {e:6.0%}")
    print(f"  fit: alpha = {fit.alpha * 1e6:.0f} us, bandwidth = {fit.bandwidth / 1e9:.2f} GB/s algbw, "
          f"n_1/2 = {fit.half_size / 1024:.0f} KiB")
    for lo, hi in ((4096, 2**20), (2**20, sizes[-1])):
        part = [(n, t) for n, t in zip(sizes, times) if lo <= n <= hi]
        if len(part) >= 3:
            f = cost.fit_alpha_beta(*zip(*part))
            print(f"  (fitted to {bench.human_size(lo)}-{bench.human_size(hi)} alone: median error "
                  f"{f.median_relative_error():.0%}, bandwidth {f.bandwidth / 1e9:.2f} GB/s)")
    goal2 = fit.median_relative_error()
    print(f"Goal 2: alpha-beta fit median relative error over {len(rows)} sizes "
          f"(4 KiB - {a.max_bytes}, {a.fit_rounds} rounds of {a.calls} calls): {goal2:.1%}   [goal <= 10%]\n")

    # Goal 3: the harness against a plain tight loop, 64 MiB, rounds taking turns in one launch.
    n = 64 * MiB
    per_rank = spawn(harness_and_loop, k, args=(n, a.rounds, a.calls))
    harness, loop = [], []
    for i in range(a.rounds):
        row = bench.combine([rank_out[i][0] for rank_out in per_rank], k)[0]  # the ranks' mean, as -a 1
        harness.append(row["busbw"])
        loop.append(cost.busbw("all_reduce", n, statistics.mean(rank_out[i][1] for rank_out in per_rank), k))
    ratios = [h / t for h, t in zip(harness, loop)]
    print(f"  harness busbw per round:    {', '.join(f'{b:.3f}' for b in harness)} GB/s")
    print(f"  tight-loop busbw per round: {', '.join(f'{b:.3f}' for b in loop)} GB/s")
    goal3 = statistics.median(ratios)
    print(f"Goal 3: harness / tight loop all-reduce busbw at 64 MiB (K=2): median over {a.rounds} rounds "
          f"{goal3:.2f} (harness {statistics.median(harness):.3f}, loop {statistics.median(loop):.3f} GB/s)"
          f"   [goal within 10%: 0.90 - 1.10]\n")

    print(f"Summary: ring/library {goal1:.2f} (>= 0.9), fit median error {goal2:.1%} (<= 10%), "
          f"harness/tight loop {goal3:.2f} (0.9 - 1.1); load average before {load_before:.1f}, "
          f"after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
