"""Goal of lecture 05: bucketed DDP step time / torch DDP step time, same model, K=2, <= 1.1.

    .venv/bin/python bench/ddp.py [--steps 60] [--cap-mb 2] [--world-size 2]

The bucketed DDP measured is the one the lecture teaches: `BucketedDDP` and `sgd_update` are imported
from notebooks/course/ddp.py, written from the lecture's #@save cells (tests/test_saved.py keeps the
two the same), so the notebook stays the one place they live.
Both DDPs train the lecture's timing model (helpers.tiny, float64) on the same data with the same
bucket cap; each step (zero_grad, forward, backward, gradient sync, SGD step) is timed on every rank,
the two variants alternate step by step, and the figure per step is the slowest rank's time. Prints
both medians (with their 10th-90th percentiles) and the ratio. It asserts no timing.
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "notebooks"))


def bench(rank, world_size, model_kw, batch, cap_mb, steps, warmup):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from course.ddp import BucketedDDP, sgd_update
    from helpers import timing, tiny
    from helpers.spawn import device

    dev = device()
    x, y = tiny.batch(batch, model_kw["dim"], seed=1 + rank, device=dev)
    runs = {}
    for name in ("bucketed", "torch DDP"):
        model = tiny.model(**model_kw, seed=0, device=dev)
        if name == "bucketed":
            ddp = BucketedDDP(model, bucket_cap_mb=cap_mb)
        else:
            ddp = DistributedDataParallel(model, bucket_cap_mb=cap_mb,
                                          device_ids=[dev.index] if dev.type == "cuda" else None)
        runs[name] = (ddp, model)
    times = {name: [] for name in runs}
    for step in range(warmup + steps):
        for name, (ddp, model) in runs.items():
            dist.barrier()
            clock = timing.Clock(dev)                  # CUDA events on a GPU, host clocks on the CPU
            clock.now("start")
            model.zero_grad()
            tiny.loss(ddp(x), y).backward()
            if name == "bucketed":
                ddp.finish_gradient_sync()
            sgd_update(model, 1e-3)
            clock.now("end")
            if step >= warmup:
                times[name].append(clock.read()["end"])
    # the two must have trained the same replicas (same data, same steps)
    a, b = (list(runs[n][1].parameters()) for n in runs)
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-9, atol=1e-12)
    buckets = {"bucketed": len(runs["bucketed"][0].buckets),
               "torch DDP": runs["torch DDP"][0]._get_ddp_logging_data().get("num_buckets_reduced")}
    return times, buckets


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60, help="timed steps per variant")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cap-mb", type=float, default=2.0, help="bucket cap of both DDPs (MiB)")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=32, help="samples per rank")
    args = ap.parse_args()

    from helpers import machine, tiny
    from helpers.spawn import spawn

    model_kw = dict(dim=args.dim, hidden=args.hidden, depth=args.depth)
    n_params = sum(p.numel() for p in tiny.model(**model_kw).parameters())
    print(machine.banner(args.world_size))
    print(f"Model {model_kw}: {n_params:,} parameters ({n_params * 8 / 2**20:.1f} MiB float64 gradients), "
          f"{args.batch} samples per rank, bucket cap {args.cap_mb:g} MiB, {args.steps} timed steps each.")
    t0 = time.perf_counter()
    runs = spawn(bench, args.world_size, args=(model_kw, args.batch, args.cap_mb, args.steps,
                                               args.warmup), timeout=600)
    figures = {}
    for name in ("bucketed", "torch DDP"):
        slowest = sorted(max(ts) for ts in zip(*(times[name] for times, _ in runs)))
        figures[name] = statistics.median(slowest)
        print(f"{name:>10}: median {figures[name] * 1e3:8.2f} ms per step  (p10 {slowest[len(slowest) // 10] * 1e3:.2f}, "
              f"p90 {slowest[(9 * len(slowest)) // 10] * 1e3:.2f}; buckets: {runs[0][1][name]})")
    ratio = figures["bucketed"] / figures["torch DDP"]
    print(f"ratio bucketed / torch DDP = {ratio:.3f}  (goal <= 1.1; {'met' if ratio <= 1.1 else 'not met'} "
          f"in this run; {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
