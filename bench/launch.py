"""How fast helpers.spawn starts ranks, against torch.multiprocessing.spawn, measured in one run.

Each launch starts 4 ranks, runs a barrier in a gloo group, and returns. Prints the cold first launch
(the fork server imports torch), the median warm launch, torch.multiprocessing.spawn's median, and
their ratio; then how many of N consecutive launches failed.

    .venv/bin/python bench/launch.py [--ranks 4] [--warm 30] [--baseline 5] [--repeat 100]
Goal (issue 2): warm <= 0.15 s and >= 30x faster than torch.multiprocessing.spawn.
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import machine  # noqa: E402
from helpers.spawn import spawn  # noqa: E402


def barrier(rank, world_size):
    dist.barrier()
    return rank


def baseline_worker(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--warm", type=int, default=30, help="warm launches to time")
    ap.add_argument("--baseline", type=int, default=5, help="torch.multiprocessing.spawn runs to time")
    ap.add_argument("--repeat", type=int, default=100, help="consecutive launches to count failures in")
    a = ap.parse_args()
    k = a.ranks
    print(machine.banner(k, "gloo"))

    cold = timed(lambda: spawn(barrier, k))
    warm = [timed(lambda: spawn(barrier, k)) for _ in range(a.warm)]
    base = [timed(lambda: mp.spawn(baseline_worker, args=(k, free_port()), nprocs=k, join=True))
            for _ in range(a.baseline)]
    w, b = statistics.median(warm), statistics.median(base)
    print(f"\nhelpers.spawn, cold first launch (server imports torch): {cold:.3f} s")
    print(f"helpers.spawn, warm launch, median of {a.warm}:           {w:.3f} s "
          f"(min {min(warm):.3f}, max {max(warm):.3f})")
    print(f"torch.multiprocessing.spawn, median of {a.baseline}:             {b:.3f} s "
          f"(min {min(base):.3f}, max {max(base):.3f})")
    print(f"ratio torch.multiprocessing.spawn / helpers.spawn (warm): {b / w:.1f}x")
    print(f"goal: warm <= 0.15 s -> {'met' if w <= 0.15 else 'NOT met'}; "
          f">= 30x -> {'met' if b / w >= 30 else 'NOT met'}")

    failures = []
    for i in range(a.repeat):
        try:
            if spawn(barrier, k, timeout=60) != list(range(k)):
                failures.append((i, "wrong values"))
        except Exception as e:  # noqa: BLE001 - counted and shown, not hidden
            failures.append((i, f"{type(e).__name__}: {str(e).splitlines()[0]}"))
    print(f"\n{len(failures)} failure(s) in {a.repeat} consecutive {k}-rank launches")
    for i, what in failures:
        print(f"  launch {i}: {what}")


if __name__ == "__main__":
    main()
