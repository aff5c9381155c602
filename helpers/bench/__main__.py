"""`python -m helpers.bench` (or under torchrun): the harness as a command; see helpers/bench/__init__.py."""
import argparse
import os
import sys

from helpers.bench.common import AVERAGE, COLLECTIVES, METHODS, size_range
from helpers.bench.files import metadata, save, table
from helpers.bench.rank import measure_rank
from helpers.bench.sweep import _plan, combine, sweep
from helpers.spawn import under_torchrun


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m helpers.bench",
        description="Benchmark collectives and write a results file. By default as nccl-tests does: "
                    "per size, -w warm-up calls, one barrier, -n calls back to back timed as one loop, "
                    "time = loop / n, the ranks' times combined by -a; algbw, busbw, #wrong. With "
                    "--method per-call: a barrier before every call, each call timed, the slowest "
                    "rank's median and 10th-90th percentiles (a spread, for noisy machines). "
                    "Standalone it starts --world-size ranks itself; under `torchrun --nproc-per-node N "
                    "-m helpers.bench` it runs in the ranks torchrun started (any number of nodes).")
    p.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter,broadcast",
                   help=f"comma-separated, from {','.join(COLLECTIVES)}, or 'all' (default: %(default)s)")
    p.add_argument("-b", "--minbytes", "--min-bytes", dest="min_bytes", default="1K",
                   help="smallest size (default: %(default)s)")
    p.add_argument("-e", "--maxbytes", "--max-bytes", dest="max_bytes", default="64M",
                   help="largest size (default: %(default)s)")
    p.add_argument("-f", "--stepfactor", "--factor", dest="factor", type=float, default=2,
                   help="size step factor (default: 2)")
    p.add_argument("-w", "--warmup_iters", "--warmup", dest="warmup", type=int, default=5,
                   help="untimed calls per size (default: 5)")
    p.add_argument("-n", "--iters", type=int, default=20,
                   help="calls per timed loop; with --method per-call, timed calls (default: 20)")
    p.add_argument("-N", "--run_cycles", "--rounds", dest="rounds", type=int, default=1,
                   help="timed loops per size, in shuffled rounds; the median is reported (default: 1)")
    p.add_argument("-d", "--datatype", "--dtype", dest="dtype", default="float32",
                   help="element type (default: float32)")
    p.add_argument("-a", "--average", type=int, default=1, choices=sorted(AVERAGE),
                   help="how the ranks' times combine: 0 rank 0, 1 mean, 2 min, 3 max (default: 1); "
                        "--method per-call always takes the slowest rank")
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1),
                   help="1: check every result and count wrong elements, #wrong (default: 1)")
    p.add_argument("--method", default="nccl-tests", choices=METHODS,
                   help="nccl-tests (a timed loop) or per-call (one timed call per barrier) (default: %(default)s)")
    p.add_argument("--world-size", type=int, default=2,
                   help="ranks to start when not under torchrun (default: 2)")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-o", "--out", default=None, help="results file, .json or .csv (default: none)")
    a = p.parse_args(argv)
    names = COLLECTIVES if a.collectives == "all" else [c.strip() for c in a.collectives.split(",") if c.strip()]
    torchrun = under_torchrun()
    k = int(os.environ["WORLD_SIZE"]) if torchrun else a.world_size
    rank = int(os.environ.get("RANK", 0)) if torchrun else 0
    if a.out and not (a.out.endswith(".json") or a.out.endswith(".csv")):
        p.error(f"--out must end in .json or .csv, got {a.out!r}")  # every rank stops alike
    unknown = [n for n in names if n not in COLLECTIVES]
    if unknown:
        p.error(f"unknown collective(s) {unknown}; choose from {', '.join(COLLECTIVES)} or 'all'")
    if a.rounds < 1 or a.iters < 1 or a.warmup < 0:
        p.error(f"need -n >= 1, -N >= 1 and -w >= 0, got {a.iters}, {a.rounds} and {a.warmup}")
    sizes = size_range(a.min_bytes, a.max_bytes, a.factor)
    hosts = []
    if torchrun:
        from helpers.spawn import spawn  # under torchrun: joins the group, runs in this process

        plan = _plan(list(names))
        per_rank = spawn(measure_rank, k, args=(plan, sizes, a.warmup, a.iters, a.dtype, bool(a.check),
                                                not a.no_progress, 0, a.method, a.rounds), backend=a.backend)
        rows = combine(per_rank, k, a.dtype, a.average)
        hosts = sorted({r["host"] for r in per_rank})
    else:
        rows = sweep(list(names), [k], sizes, a.warmup, a.iters, a.dtype, a.backend, bool(a.check),
                     not a.no_progress, average=a.average, method=a.method, rounds=a.rounds)
    if rank != 0:
        return rows
    from helpers.machine import banner

    print(banner(k, rows[0]["backend"] if rows else a.backend))
    table(rows)
    wrong = sum(max(r["wrong"], 0) for r in rows)
    print(f"# out-of-bounds values: {wrong} ({'OK' if wrong == 0 else 'WRONG RESULTS'})")
    if a.out:
        params = {"collectives": list(names), "sizes": sizes, "warmup": a.warmup, "iters": a.iters,
                  "rounds": a.rounds, "method": a.method, "average": a.average, "dtype": a.dtype,
                  "check": bool(a.check)}
        args = " ".join(sys.argv[1:] if argv is None else argv)
        local = int(os.environ.get("LOCAL_WORLD_SIZE", k))
        command = (f"torchrun --nnodes {k // local} --nproc-per-node {local} -m helpers.bench {args}"
                   if torchrun else f"python -m helpers.bench {args}")
        save(rows, a.out, metadata(k, rows[0]["backend"] if rows else a.backend, hosts or None, params,
                                   command))
        print(f"# results written to {a.out}")
    return rows


if __name__ == "__main__":
    main()
